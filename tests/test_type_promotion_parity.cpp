// Type promotion against PyTorch (tests/parity/torch_type_promotion.py): torch.result_type
// for every pair of dtypes as tensors with dimensions, 0-dim tensors and C++ numbers, and
// the values and dtypes of add, sub, mul, div, lt and maximum over every pair of dtypes.
#include <fstream>
#include <sstream>

#include "parity_io.h"

using namespace mu;
using namespace parity;

namespace {

DType dtype_named(const std::string& name) {
  for (DType t : kAllDTypes)
    if (name == dtype_name(t)) return t;
  FAIL("unknown dtype " << name);
  return kFloat32;
}

// The operand a line of result_types.txt describes: a [6] or 0-dim tensor of ones.
Tensor tensor_operand(const std::string& kind, const std::string& dtype) {
  return ones(kind == "dim" ? Shape{6} : Shape{}, dtype_named(dtype));
}

Scalar number_operand(const std::string& kind) {
  if (kind == "bool") return Scalar(true);
  if (kind == "int") return Scalar(2);
  return Scalar(2.5);
}

}  // namespace

TEST_CASE("result_type and mixed-dtype elementwise ops agree with PyTorch") {
  std::filesystem::path dir = make_temp_dir("type_promotion");
  run_torch_script("torch_type_promotion.py", dir);

  std::ifstream types(dir / "result_types.txt");
  std::string ka, da, kb, db, want;
  int cases = 0;
  while (types >> ka >> da >> kb >> db >> want) {
    INFO(ka << " " << da << " with " << kb << " " << db);
    Tensor a = tensor_operand(ka, da);
    DType got = kb == "number" ? result_type(a, number_operand(db)) : result_type(a, tensor_operand(kb, db));
    CHECK(std::string(dtype_name(got)) == want);
    ++cases;
  }
  CHECK(cases == 2 * 10 * (10 + 10 + 3));

  const Tensor a0 = tensor({1.0, 2.0, 3.0, 0.0, 5.0, 7.0}), b0 = tensor({2.0, 1.0, 3.0, 4.0, 0.0, 1.0});
  std::ifstream values(dir / "values.txt");
  std::string line;
  int lines = 0;
  while (std::getline(values, line)) {
    std::istringstream in(line);
    std::string op;
    in >> da >> db >> op >> want;
    std::vector<double> expected(6);
    for (double& v : expected) {
      std::string word;  // std::stod reads Python's "inf" too
      in >> word;
      v = std::stod(word);
    }
    INFO(op << "(" << da << ", " << db << ")");
    Tensor a = a0.to(dtype_named(da)), b = b0.to(dtype_named(db));
    Tensor y = op == "add" ? a + b : op == "sub" ? a - b : op == "mul" ? a * b : op == "div" ? a / b
               : op == "lt" ? a < b : maximum(a, b);
    CHECK(std::string(dtype_name(y.dtype())) == want);
    CHECK(y.to_vector<double>() == expected);
    ++lines;
  }
  // sub is skipped by torch for the 19 pairs with a bool operand.
  CHECK(lines == 100 * 6 - 19);
  std::filesystem::remove_all(dir);
}
