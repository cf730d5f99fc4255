// Node's destructor: the release of a deep graph in constant stack depth.
//
// Left to the defaults, destroying the last handle on a graph destroys the top node's
// next_edges, whose shared_ptr destroys the producer node, whose next_edges destroy its
// producer, and so on: one nest of destructor frames per op, so a chain of 10^5..10^6
// ops (an RNN unrolled over a long sequence, x = x * c in a loop) overflows the stack.
// Instead each dying node hands the producers that it alone keeps alive to a worklist,
// and a worklist node is stripped of its own producers the same way before it dies, so
// no destructor ever finds a producer to destroy inside itself.
#include "autograd/node.h"

namespace mu::autograd {

namespace {

// The nodes waiting to be destroyed. The first waits in a plain slot, so releasing a
// chain (at most one producer per node owned by that node alone) never allocates; only
// a node with several sole-owned producers spills into the vector.
struct Orphans {
  std::shared_ptr<Node> first;
  std::vector<std::shared_ptr<Node>> more;

  void add(std::shared_ptr<Node> n) {
    if (!first)
      first = std::move(n);
    else
      more.push_back(std::move(n));
  }
  // The next node to destroy (null when none is left); the caller owns it alone.
  std::shared_ptr<Node> take() {
    if (first) return std::move(first);  // leaves `first` null
    if (more.empty()) return nullptr;
    std::shared_ptr<Node> n = std::move(more.back());
    more.pop_back();
    return n;
  }
};

// Empties `edges`: a producer held by others loses this reference; one that only these
// edges held goes to `orphans` (to be destroyed by the caller's loop, not in here).
void drop_edges(std::vector<Edge>& edges, Orphans& orphans) {
  for (Edge& e : edges) {
    if (!e.fn) continue;
    // Taken out of the edge first, so that two edges of this node to the same producer
    // (y = x * x) count as one owner: the first lets go, the second then holds the last
    // reference and queues it.
    std::shared_ptr<Node> fn = std::move(e.fn);
    if (fn.use_count() == 1) orphans.add(std::move(fn));  // this was the last owner
    // Otherwise `fn` lets go here; someone else still holds the producer, so nothing dies.
  }
}

}  // namespace

Node::~Node() {
  // The fast path (no producers, shared ones, or a chain) allocates nothing: `more` stays
  // empty. Each worklist node's own destructor finds its edges already emptied.
  Orphans orphans;
  drop_edges(next_edges, orphans);
  while (std::shared_ptr<Node> n = orphans.take()) {
    drop_edges(n->next_edges, orphans);
    // `n` dies here, at the end of the iteration, with nothing left below it to destroy.
  }
}

}  // namespace mu::autograd
