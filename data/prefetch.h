// Background batch preparation: a producer thread builds the next batches (index_select
// of the epoch's samples, augmentation) into a bounded queue while the training thread
// works on the current one.
//
//   data::DataLoader loader(n, data::DataLoaderOptions(128).generator(&shuffle_gen));
//   data::Prefetcher pf(data::epoch_source(images, labels, loader.epoch(), augment, &aug_gen), 4);
//   while (auto batch = pf.next()) train_step(batch->input, batch->target);
//
// A source given its own Generator yields the same batches whether it is called on the
// producer thread or directly. The producer runs with gradient recording off. An
// exception thrown by the source stops the producer and is re-raised by the consumer's
// next() (a mu::Error as itself, anything else as a mu::Error carrying its message).
// Destroying the Prefetcher stops the producer and joins it, whether or not the batches
// were all taken.
#pragma once
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace mu::data {

// Called repeatedly for the next batch; nullopt ends the stream.
using BatchSource = std::function<std::optional<Batch>()>;
// An augmentation of an image batch drawing from the given generator.
using Augment = std::function<Tensor(const Tensor& images, Generator* gen)>;

// The batches of one epoch in order: rows `indices[k]` of images and labels, the images
// passed through `augment` (may be empty) with `gen` (null: the global generator). The
// tensors and the generator must outlive the source.
BatchSource epoch_source(Tensor images, Tensor labels, std::vector<Tensor> indices, Augment augment = {},
                         Generator* gen = nullptr);

class Prefetcher {
 public:
  // Starts the producer; at most `capacity` (>= 1) finished batches wait in the queue.
  explicit Prefetcher(BatchSource source, int64_t capacity = 2);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The next batch, waiting for it if needed; nullopt once the source is exhausted. If
  // the source threw, that error is raised here (and again on later calls).
  std::optional<Batch> next();
  int64_t capacity() const { return capacity_; }

 private:
  void produce();

  BatchSource source_;
  int64_t capacity_;
  std::mutex m_;
  std::condition_variable ready_;  // a batch was queued, or the producer ended
  std::condition_variable space_;  // a batch was taken, or stop was asked
  std::deque<Batch> queue_;
  bool finished_ = false;  // the producer will queue nothing more
  bool stop_ = false;      // the consumer is going away
  std::exception_ptr error_;
  std::thread thread_;     // last: started once every member above exists
};

}  // namespace mu::data
