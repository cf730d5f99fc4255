#include "data/prefetch.h"

#include "autograd/grad_mode.h"
#include "ops/ops.h"

namespace mu::data {

BatchSource epoch_source(Tensor images, Tensor labels, std::vector<Tensor> indices, Augment augment, Generator* gen) {
  MU_CHECK(images.defined() && labels.defined(), "epoch_source: images and labels must be defined");
  MU_CHECK(images.dim() >= 1 && labels.dim() >= 1 && images.size(0) == labels.size(0), "epoch_source: ",
           shape_str(images.shape()), " images and ", shape_str(labels.shape()), " labels differ in the sample count");
  // The position in the epoch lives in the closure, shared by its copies.
  auto next = std::make_shared<size_t>(0);
  return [=]() -> std::optional<Batch> {
    if (*next >= indices.size()) return std::nullopt;
    const Tensor& idx = indices[(*next)++];
    Batch b{index_select(images, 0, idx), index_select(labels, 0, idx)};
    if (augment) b.input = augment(b.input, gen);
    return b;
  };
}

Prefetcher::Prefetcher(BatchSource source, int64_t capacity) : source_(std::move(source)), capacity_(capacity) {
  MU_CHECK(source_ != nullptr, "Prefetcher: the batch source is empty");
  MU_CHECK(capacity_ >= 1, "Prefetcher: capacity must be at least 1, got ", capacity_);
  thread_ = std::thread([this] { produce(); });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(m_);
    stop_ = true;
  }
  space_.notify_all();
  thread_.join();
}

void Prefetcher::produce() {
  // Batches are data, not part of any graph (grad mode is per thread).
  autograd::NoGradGuard no_grad;
  try {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(m_);
        space_.wait(lock, [&] { return stop_ || int64_t(queue_.size()) < capacity_; });
        if (stop_) break;
      }
      // Built outside the lock, so the consumer takes batches meanwhile.
      std::optional<Batch> b = source_();
      std::lock_guard<std::mutex> lock(m_);
      if (!b) break;
      queue_.push_back(std::move(*b));
      ready_.notify_one();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(m_);
    error_ = std::current_exception();
  }
  std::lock_guard<std::mutex> lock(m_);
  finished_ = true;
  ready_.notify_all();
}

std::optional<Batch> Prefetcher::next() {
  std::unique_lock<std::mutex> lock(m_);
  ready_.wait(lock, [&] { return !queue_.empty() || finished_; });
  // Batches queued before a failure are still handed out, in order; then the error.
  if (!queue_.empty()) {
    Batch b = std::move(queue_.front());
    queue_.pop_front();
    space_.notify_one();
    return b;
  }
  if (error_) {
    try {
      std::rethrow_exception(error_);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      MU_FAIL("Prefetcher: the batch source failed: ", e.what());
    } catch (...) {
      MU_FAIL("Prefetcher: the batch source failed with an exception that is not a std::exception");
    }
  }
  return std::nullopt;
}

}  // namespace mu::data
