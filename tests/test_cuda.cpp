// CUDA device plumbing. Skipped (exit code 77, which ctest reports as skipped) with the
// reason printed when this machine has no CUDA device or the build has no CUDA.
#include "helpers.h"

using namespace mu;

[[maybe_unused]] static const bool kHaveDevice = skip_without_cuda("the CUDA tests");

TEST_CASE("host -> device -> host round trip keeps every value") {
  manual_seed(0);
  Tensor x = randn({257, 33}, kFloat64);
  Tensor d = x.to(Device::cuda());
  CHECK(d.device() == Device::cuda());
  CHECK(d.shape() == x.shape());
  Tensor back = d.cpu();
  CHECK(back.to_vector<double>() == x.to_vector<double>());
  // a non-contiguous source is made dense on the way
  Tensor t = x.t().to(Device::cuda()).cpu();
  CHECK(t.to_vector<double>() == x.t().contiguous().to_vector<double>());
}

TEST_CASE("factories on the device") {
  Tensor z = zeros({4, 5}, Device::cuda());
  CHECK(z.device().is_cuda());
  for (double v : z.cpu().to_vector<double>()) CHECK(v == 0.0);
  Tensor f = full({3}, 2.5, TensorOptions(kFloat32).device(Device::cuda()));
  CHECK(f.cpu().to_vector<float>() == std::vector<float>{2.5f, 2.5f, 2.5f});
  CHECK(f.at({1}) == 2.5);
  CHECK(f.str().find("device=cuda:0") != std::string::npos);
}

TEST_CASE("gradients flow back across devices") {
  Tensor x = tensor({1.0, 2.0}, kFloat64).requires_grad_();
  Tensor y = x.to(Device::cuda()).to(Device::cpu());
  (y * y).sum().backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2.0, 4.0});
}

TEST_CASE("errors for device indices that do not exist and operands on two devices") {
  CHECK_THROWS_MU(zeros({2}, Device::cuda(cuda::device_count())), "out of range");
  Tensor d = ones({2}).to(Device::cuda());
  CHECK_THROWS_MU(d + ones({2}), "device mismatch: cuda:0 vs cpu");
}

TEST_CASE("the caching allocator reuses a freed block and counts live, peak and cached bytes") {
  // MUMOE_NO_CACHING=1 (the emulated device's immediate run): every freed block goes back
  // to the driver at once, so nothing is cached.
  const char* no_caching = std::getenv("MUMOE_NO_CACHING");
  const bool caching = !(no_caching && no_caching[0] == '1');
  if (!caching) std::printf("MUMOE_NO_CACHING=1: checking that freed blocks are not cached\n");
  cuda::empty_cache(0);
  const MemoryStats before = cuda::memory_stats(0);
  CHECK(before.cached_bytes == 0);
  const void* first = nullptr;
  {
    Tensor a = empty({1 << 20}, TensorOptions(kFloat32).device(Device::cuda()));  // 4 MiB
    first = a.raw_data();
    const MemoryStats held = cuda::memory_stats(0);
    CHECK(held.allocated_bytes - before.allocated_bytes == 4 << 20);
    CHECK(held.peak_bytes >= held.allocated_bytes);
  }
  const MemoryStats freed = cuda::memory_stats(0);
  CHECK(freed.allocated_bytes == before.allocated_bytes);
  CHECK(freed.cached_bytes == (caching ? 4 << 20 : 0));
  // A request of the same size class gets the same block back, and the cache empties.
  Tensor b = empty({(1 << 20) - 100}, TensorOptions(kFloat32).device(Device::cuda()));
  if (caching) CHECK(b.raw_data() == first);
  CHECK(cuda::memory_stats(0).cached_bytes == 0);
  cuda::reset_peak_memory(0);
  CHECK(cuda::memory_stats(0).peak_bytes == cuda::memory_stats(0).allocated_bytes);
}

TEST_CASE("MUMOE_CUDA_POISON=1: every block handed out holds all-ones bytes, a reused one too") {
  // ctest runs this case again as test_cuda_poison with the variable set.
  const char* v = std::getenv("MUMOE_CUDA_POISON");
  const bool poison = v && v[0] == '1';
  const char* no_caching = std::getenv("MUMOE_NO_CACHING");
  const bool caching = !(no_caching && no_caching[0] == '1');
  std::printf("MUMOE_CUDA_POISON %s, caching %s\n", poison ? "on" : "off", caching ? "on" : "off");
  const TensorOptions i32 = TensorOptions(kInt32).device(Device::cuda());
  const void* first = nullptr;
  {
    Tensor a = full({1000}, 3.0, i32);  // written, then freed into the cache
    first = a.raw_data();
    CHECK(a.cpu().to_vector<int64_t>() == std::vector<int64_t>(1000, 3));
  }
  Tensor b = empty({1000}, i32);
  const std::vector<int64_t> got = b.cpu().to_vector<int64_t>();
  if (poison) {
    CHECK(got == std::vector<int64_t>(1000, -1));  // all-ones bytes, whatever the block held
  } else if (caching && b.raw_data() == first) {
    CHECK(got == std::vector<int64_t>(1000, 3));  // the freed tensor's values: what poison replaces
  }
}

TEST_CASE("out of device memory is an error naming the bytes requested and held") {
  // 2^46 bytes (64 TiB): more than any device has, less than the allocator's cap.
  CHECK_THROWS_MU(empty({int64_t(1) << 44}, TensorOptions(kFloat32).device(Device::cuda())),
                  "CUDA out of memory on cuda:0: tried to allocate 70368744177664 bytes");
  // The device still works afterwards.
  CHECK(ones({3}, TensorOptions(kFloat32).device(Device::cuda())).sum().item() == 3.0);
}

TEST_CASE("transfers larger than the staging chunks arrive whole") {
  // 40 MiB crosses two 16 MiB staging chunks and ends inside a third.
  const int64_t n = (int64_t(40) << 20) / 4 + 3;
  Tensor x = arange(0, double(n), 1.0, TensorOptions(kFloat32));
  Tensor back = x.to(Device::cuda()).cpu();
  CHECK(back.to_vector<float>() == x.to_vector<float>());
}

TEST_CASE("copies on the device: strided, broadcast and converting, equal to the CPU's") {
  manual_seed(3);
  Tensor x = randn({37, 53}, kFloat32) * 100.0;
  Tensor d = x.to(Device::cuda());
  CHECK(d.t().contiguous().cpu().to_vector<float>() == x.t().contiguous().to_vector<float>());
  for (DType t : kAllDTypes) {
    INFO(dtype_name(t));
    // Values each dtype holds (a float out of an integer type's range converts to
    // whatever the hardware gives, on the CPU as on the GPU).
    Tensor src = t == kInt8 ? clamp(x, -128, 127) : t == kUInt8 ? clamp(abs(x), 0, 255) : x;
    Tensor want = src.to(t);
    Tensor got = src.to(Device::cuda()).to(t).cpu();
    CHECK(got.dtype() == t);
    CHECK(got.to(kFloat64).to_vector<double>() == want.to(kFloat64).to_vector<double>());
    // back from t on the device, through a transposed view
    CHECK(got.to(Device::cuda()).t().to(kFloat64).cpu().to_vector<double>() ==
          want.t().to(kFloat64).to_vector<double>());
  }
  // copy_ broadcasts a row into every row of a strided destination
  Tensor dst = zeros({4, 6}, Device::cuda());
  dst.t().copy_(arange(0, 4, 1, TensorOptions(kFloat32)).to(Device::cuda()));
  Tensor want = zeros({4, 6});
  want.t().copy_(arange(0, 4, 1, TensorOptions(kFloat32)));
  CHECK(dst.cpu().to_vector<float>() == want.to_vector<float>());
  // Copies whose innermost dim is dense on both sides move 16-byte packs: transposed heads
  // (bfloat16, float32, a converting one), a column block of a wider destination (as a
  // cat writes it), and the cases that must stay one element at a time (a source one
  // element off its 16-byte alignment, an inner size no pack divides).
  Tensor heads = randn({2, 5, 3, 64}, kFloat32);
  for (DType t : {kBFloat16, kFloat32}) {
    INFO("heads " << dtype_name(t));
    Tensor h = heads.to(t);
    Tensor on_gpu = h.to(Device::cuda()).permute({0, 2, 1, 3}).contiguous().cpu();
    CHECK(on_gpu.to(kFloat64).to_vector<double>() == h.permute({0, 2, 1, 3}).contiguous().to(kFloat64).to_vector<double>());
  }
  Tensor conv = heads.to(Device::cuda()).permute({0, 2, 1, 3}).to(kBFloat16).cpu();
  CHECK(conv.to(kFloat64).to_vector<double>() == heads.permute({0, 2, 1, 3}).to(kBFloat16).to(kFloat64).to_vector<double>());
  Tensor wide = zeros({4, 24}, TensorOptions(kBFloat16).device(Device::cuda()));
  Tensor block = randn({4, 8}).to(kBFloat16);
  wide.narrow(1, 8, 8).copy_(block.to(Device::cuda()));
  Tensor wide_want = zeros({4, 24}, TensorOptions(kBFloat16));
  wide_want.narrow(1, 8, 8).copy_(block);
  CHECK(wide.cpu().to(kFloat64).to_vector<double>() == wide_want.to(kFloat64).to_vector<double>());
  Tensor flat = randn({2 * 3 * 64 + 1});
  auto shifted = [](const Tensor& t) { return t.narrow(0, 1, 2 * 3 * 64).view({2, 3, 64}).permute({1, 0, 2}); };
  CHECK(shifted(flat.to(Device::cuda())).contiguous().cpu().to_vector<float>() ==
        shifted(flat).contiguous().to_vector<float>());
  Tensor odd = randn({4, 5, 6});
  CHECK(odd.to(Device::cuda()).permute({1, 0, 2}).contiguous().cpu().to_vector<float>() ==
        odd.permute({1, 0, 2}).contiguous().to_vector<float>());
  // fill_ through a strided view
  Tensor f = zeros({5, 8}, Device::cuda());
  f.narrow(1, 2, 3).fill_(7.5);
  Tensor fw = zeros({5, 8});
  fw.narrow(1, 2, 3).fill_(7.5);
  CHECK(f.cpu().to_vector<float>() == fw.to_vector<float>());
}

TEST_CASE("sort, topk and max/min along a dim copy nothing to the host; gather's bounds check does") {
  // Their positions come from the library's own kernels, in range: no index is copied to
  // the host to be checked (each copy a synchronisation; a sampling step's topk and every
  // top-k routing of a sparse MoE would stall the GPU). gather of a user's index is checked.
  manual_seed(5);
  const Tensor x = randn({4, 3000}).to(Device::cuda());
  const cuda::HostTransfers before = cuda::host_transfers(0);
  const ValuesIndices t = topk(x, 7, 1), s = sort(x, 1, true), mx = x.max(1), mn = x.min(1, true);
  const cuda::HostTransfers after = cuda::host_transfers(0);
  CHECK(after.to_host == before.to_host);
  CHECK(after.to_device == before.to_device);
  // The results, read back (copies now), agree with each other and the CPU.
  const Tensor xc = x.cpu();
  CHECK(t.indices.cpu().to_vector<int64_t>() == topk(xc, 7, 1).indices.to_vector<int64_t>());
  CHECK(s.values.narrow(1, 0, 7).cpu().to_vector<float>() == t.values.cpu().to_vector<float>());
  CHECK(mx.indices.cpu().to_vector<int64_t>() == xc.max(1).indices.to_vector<int64_t>());
  CHECK(mn.values.cpu().to_vector<float>() == xc.min(1, true).values.to_vector<float>());
  const Tensor idx = t.indices;  // on the device
  const cuda::HostTransfers g0 = cuda::host_transfers(0);
  const Tensor g = gather(x, 1, idx);
  CHECK(cuda::host_transfers(0).to_host == g0.to_host + 1);
  CHECK(g.cpu().to_vector<float>() == t.values.cpu().to_vector<float>());
}

TEST_CASE("index_add checks its index once: its backward copies nothing to the host") {
  manual_seed(6);
  const Tensor x = zeros({5, 3}).to(Device::cuda()).requires_grad_();
  const Tensor src = randn({4, 3}).to(Device::cuda()).requires_grad_();
  const Tensor idx = from_vector(std::vector<int64_t>{4, 0, 4, 2}, {4}).to(Device::cuda());
  const cuda::HostTransfers f0 = cuda::host_transfers(0);
  const Tensor y = index_add(x, 0, idx, src);
  CHECK(cuda::host_transfers(0).to_host == f0.to_host + 1);  // the bounds check
  const Tensor g = randn({5, 3}).to(Device::cuda());
  const cuda::HostTransfers b0 = cuda::host_transfers(0);
  y.backward(g);
  CHECK(cuda::host_transfers(0).to_host == b0.to_host);
  // src's gradient is g's rows at the index.
  const std::vector<float> gv = g.cpu().to_vector<float>(), sg = src.grad().cpu().to_vector<float>();
  const int64_t rows[4] = {4, 0, 4, 2};
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j) CHECK(sg[size_t(i * 3 + j)] == gv[size_t(rows[i] * 3 + j)]);
  CHECK(x.grad().cpu().to_vector<float>() == gv);
  CHECK_THROWS_MU(index_add(x, 0, from_vector(std::vector<int64_t>{5}, {1}).to(Device::cuda()), src.narrow(0, 0, 1)),
                  "index_add: index 5 is out of bounds for dimension 0 with size 5");
}
