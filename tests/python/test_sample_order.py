"""The sample-order algorithms a client or a tool can reproduce (shuffle
window interleave, mixed-job shares and order), written from their
specification in protos/README.md alone, against the vectors in
protos/sample_order_vectors.json that the servers' own code is checked
against (tests/unit/common/sample_order_vectors_test.cc)."""
import json
import os
from fractions import Fraction

VECTORS = os.path.join(os.path.dirname(__file__), "..", "..", "protos",
                       "sample_order_vectors.json")
M64 = (1 << 64) - 1


def mix(z):
    z &= M64
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & M64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


class SplitMix64:
    def __init__(self, seed, stream):
        self.state = mix(seed) ^ mix((stream & M64) ^ 0xD1B54A32D192ED03)

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & M64
        return mix(self.state)


def window_order_seed(seed, epoch, window):
    return mix(mix(seed) ^ mix((epoch & M64) ^ 0xA0761D6478BD642F) ^ mix(window + 1))


def window_labels(piece_samples, order_seed):
    labels = [k for k, n in enumerate(piece_samples) for _ in range(max(n, 0))]
    rng = SplitMix64(order_seed, 0)
    for i in range(len(labels) - 1, 0, -1):
        j = rng.next() % (i + 1)
        labels[i], labels[j] = labels[j], labels[i]
    return labels


def apportion(total, weights):
    whole = sum(Fraction(w) for w in weights)
    exact = [total * Fraction(w) / whole for w in weights]
    counts = [int(e) for e in exact]
    by_remainder = sorted(range(len(weights)), key=lambda s: (-(exact[s] - counts[s]), s))
    for k in range(total - sum(counts)):
        counts[by_remainder[k % len(weights)]] += 1
    return counts


def mix_sources(counts):
    k = len(counts)
    # Source s's j-th sample at time (j + (s + 1/2) / k) / c_s; ties to the
    # lower source.
    timed = [(Fraction(2 * k * j + 2 * s + 1, 2 * k * c), s)
             for s, c in enumerate(counts) for j in range(c)]
    return [s for _, s in sorted(timed)]


def vectors(kind):
    with open(VECTORS) as f:
        cases = json.load(f)[kind]
    assert cases
    return cases


def test_window_order_seeds_follow_the_spec():
    for c in vectors("window_order_seed"):
        assert window_order_seed(int(c["seed"]), c["epoch"], c["window"]) == int(
            c["order_seed"]), c


def test_window_labels_follow_the_spec():
    for c in vectors("window_labels"):
        assert window_labels(c["piece_samples"], int(c["order_seed"])) == c["labels"], c


def test_mixed_shares_follow_the_spec():
    for c in vectors("apportion"):
        assert apportion(c["total"], c["weights"]) == c["counts"], c


def test_the_mix_order_follows_the_spec():
    for c in vectors("mix_sources"):
        assert mix_sources(c["counts"]) == c["sources"], c
