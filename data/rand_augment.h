// RandAugment (Cubuk et al. 2020) on uint8 images with interleaved channels (H, W, C),
// C = 1 or 3, as torchvision.transforms.RandAugment applies it to PIL images: the same 14
// operations, the same magnitude table, and each operation computed as Pillow 9 computes
// it (nearest-neighbour affine transforms on pixel centres with 16.16 fixed-point steps,
// ImageEnhance's blends in float, ImageOps' lookup tables), so that results match PIL's
// pixel for pixel.
//
//   data::RandAugmentOptions o;  o.num_ops = 2;  o.magnitude = 15;
//   data::rand_augment_image(image, 224, 224, 3, o, gen);        // one image, in place
//   Tensor y = data::rand_augment(batch_u8, o, seed);             // (B, H, W, C), a new tensor
//
// Where torchvision's own definitions and PIL's meet (which matrix a shear passes, how a
// magnitude becomes a shift), the comments in rand_augment.cpp say which is followed.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "tensor/random.h"
#include "tensor/tensor.h"

namespace mu::data {

// The operations of RandAugment as torchvision.transforms.RandAugment lists them.
enum class AugmentOp {
  Identity,
  ShearX,
  ShearY,
  TranslateX,
  TranslateY,
  Rotate,
  Brightness,
  Color,
  Contrast,
  Sharpness,
  Posterize,
  Solarize,
  AutoContrast,
  Equalize
};
// "ShearX" etc., torchvision's names.
const char* augment_op_name(AugmentOp op);

// Applies `op` to one image, uint8 (H, W, C) row-major with interleaved channels, C = 1 or
// 3, in place. `magnitude` is the op's real-valued strength with its sign where it has one:
//   ShearX / ShearY    shear factor m: output pixel (x, y) reads input (x + m·y, y) (ShearX)
//                      or (x, y + m·x) (ShearY), about the top-left corner
//   TranslateX / Y     pixels, truncated towards zero; positive moves the content right / down
//   Rotate             degrees, counter-clockwise about the image centre, same size
//   Brightness, Color, Contrast, Sharpness
//                      the enhance factor minus 1 (0: the image unchanged)
//   Posterize          bits kept, truncated to an integer in [0, 8]
//   Solarize           threshold: values >= it are inverted (256 or more: none)
//   Identity, AutoContrast, Equalize
//                      ignored
// `fill` is the value of every channel of pixels that the geometric ops bring in from
// outside the image. For C = 1 the single channel is the grey level (Color is the identity).
void apply_augment_op(AugmentOp op, double magnitude, uint8_t* image, int64_t H, int64_t W, int64_t C,
                      uint8_t fill = 0);

struct RandAugmentOptions {
  int64_t num_ops = 2;     // ops applied to each image, drawn with replacement
  int64_t magnitude = 9;   // the bin of the magnitude table, in [0, num_bins)
  int64_t num_bins = 31;   // the table's size (torchvision's num_magnitude_bins)
  uint8_t fill = 0;        // the value geometric ops bring in from outside the image
};

// The magnitude torchvision's RandAugment gives `op` at bin `magnitude` of `num_bins` for an
// H x W image, unsigned: ShearX/Y linspace(0, 0.3), TranslateX linspace(0, 150/331·W),
// TranslateY linspace(0, 150/331·H), Rotate linspace(0, 30) degrees,
// Brightness/Color/Contrast/Sharpness linspace(0, 0.9), Posterize
// 8 - round(arange(num_bins) / ((num_bins - 1) / 4)) bits, Solarize linspace(255, 0);
// 0 for Identity, AutoContrast and Equalize. The tables are float32 in torchvision, and so
// are these values: the exact linspace value rounded to float32 (torch's CPU kernel comes
// within a float32 rounding or two of it, depending on the machine), widened to double.
double rand_augment_magnitude(AugmentOp op, int64_t magnitude, int64_t num_bins, int64_t H, int64_t W);

// One image in place: num_ops ops drawn uniformly (with replacement) from the 14, the
// signed ones (shears, translations, rotation, the four enhance ops) negated with
// probability 1/2, applied in turn, all drawn from `gen` under one lock. When `applied` is
// given it receives (op, signed magnitude) for each op, in order.
void rand_augment_image(uint8_t* image, int64_t H, int64_t W, int64_t C, const RandAugmentOptions& options,
                        Generator& gen, std::vector<std::pair<AugmentOp, double>>* applied = nullptr);

// A batch: uint8 (B, H, W, C) on the CPU, C = 1 or 3; returns a new tensor. Sample b draws
// from a Generator of its own seeded with mix_seed(seed, b), and the samples run in an
// OpenMP loop: the result depends on the seed alone, not on the thread count.
Tensor rand_augment(const Tensor& images, const RandAugmentOptions& options, uint64_t seed);

}  // namespace mu::data
