"""Small NumPy models whose training steps give the simulation real gradients.

Nothing is downloaded: each workload generates its data from a seed, so every worker of the
end-to-end simulation holds the gradient of a real training step on its own data shard.

- :class:`DenseMLP`: a two-layer perceptron classifying points drawn from Gaussian
  clusters. Dense gradients, mostly small values: the INCEPTIONN path's case.
- :class:`NcfModel`: an NCF-like recommender (user and item embedding tables, a dot product
  and a logistic loss) on implicit feedback from a hidden latent-factor model. A minibatch
  touches few table rows, so the gradient is naturally sparse: the in-network path's case.

Both expose ``params`` (one flat float32 vector), ``gradient(worker, step)`` (the flat
float32 gradient of worker ``worker``'s minibatch at ``step``, at the current parameters),
``apply(update)`` (SGD step) and ``loss(worker, step)``.
"""
from __future__ import annotations

import numpy as np

__all__ = ["DenseMLP", "NcfModel", "WORKLOADS"]


class _FlatParams:
    """Views of named arrays into one flat float32 vector."""

    def _init_flat(self, shapes, rng, scale):
        sizes = [int(np.prod(s)) for s in shapes.values()]
        self.params = np.zeros(sum(sizes), dtype=np.float32)
        self._views = {}
        start = 0
        for (name, shape), size in zip(shapes.items(), sizes):
            view = self.params[start:start + size].reshape(shape)
            view[...] = (rng.standard_normal(shape) * scale[name]).astype(np.float32)
            self._views[name] = view
            start += size

    def __getattr__(self, name):
        views = self.__dict__.get("_views", {})
        if name in views:
            return views[name]
        raise AttributeError(name)

    def layout(self) -> dict:
        """``{name: (start, stop)}``: where each parameter tensor sits in ``params`` (and in
        every flat gradient), in order."""
        out, start = {}, 0
        for name, view in self._views.items():
            out[name] = (start, start + view.size)
            start += view.size
        return out

    def _flatten(self, grads):
        return np.concatenate([grads[name].astype(np.float32).ravel() for name in self._views])

    def apply(self, update, lr):
        """SGD step with the all-reduced (averaged) gradient ``update``."""
        self.params -= np.float32(lr) * np.asarray(update, dtype=np.float32)


class DenseMLP(_FlatParams):
    """Two-layer MLP (tanh, softmax) on Gaussian-cluster data; dense gradients.

    Parameters
    ----------
    inputs, hidden, classes : int
        Layer sizes.
    batch : int
        Minibatch per worker and step.
    seed : int
        Seeds the data and the initial weights (identical on every worker).
    """

    def __init__(self, *, inputs=64, hidden=128, classes=10, batch=32, seed=0):
        for name, value in (("inputs", inputs), ("hidden", hidden), ("classes", classes),
                            ("batch", batch)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"DenseMLP {name} must be a positive integer, not {value!r}")
        rng = np.random.default_rng(seed)
        self.batch, self.seed, self.classes = batch, seed, classes
        self.centres = rng.standard_normal((classes, inputs)).astype(np.float32)
        self._init_flat({"w1": (inputs, hidden), "b1": (hidden,), "w2": (hidden, classes),
                         "b2": (classes,)}, rng,
                        {"w1": 1 / np.sqrt(inputs), "b1": 0.0, "w2": 1 / np.sqrt(hidden),
                         "b2": 0.0})

    def _batch(self, worker, step):
        rng = np.random.default_rng([self.seed, worker, step, 1])
        labels = rng.integers(0, self.classes, self.batch)
        x = self.centres[labels] + rng.standard_normal((self.batch, self.centres.shape[1])) * 1.5
        return x.astype(np.float32), labels

    def _forward(self, x):
        h = np.tanh(x @ self.w1 + self.b1)
        logits = h @ self.w2 + self.b2
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        return h, p

    def loss(self, worker, step):
        x, y = self._batch(worker, step)
        _, p = self._forward(x)
        return float(-np.mean(np.log(p[np.arange(len(y)), y] + 1e-12)))

    def gradient(self, worker, step):
        x, y = self._batch(worker, step)
        h, p = self._forward(x)
        d_logits = p.copy()
        d_logits[np.arange(len(y)), y] -= 1
        d_logits /= len(y)
        dh = (d_logits @ self.w2.T) * (1 - h * h)
        return self._flatten({"w1": x.T @ dh, "b1": dh.sum(0), "w2": h.T @ d_logits,
                              "b2": d_logits.sum(0)})


class NcfModel(_FlatParams):
    """NCF-like recommender: embedding tables and item biases, dot product, logistic loss;
    sparse gradients.

    Parameters
    ----------
    users, items, dim : int
        Table sizes.
    batch : int
        (user, item, label) triples per worker and step; positives come from a hidden
        latent-factor model, negatives are sampled uniformly.
    seed : int
        Seeds data and weights.
    """

    def __init__(self, *, users=4096, items=2048, dim=16, batch=64, seed=0):
        for name, value in (("users", users), ("items", items), ("dim", dim), ("batch", batch)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"NcfModel {name} must be a positive integer, not {value!r}")
        rng = np.random.default_rng(seed)
        self.batch, self.seed = batch, seed
        self.users, self.items = users, items
        self._true_u = rng.standard_normal((users, 4)).astype(np.float32)
        self._true_i = rng.standard_normal((items, 4)).astype(np.float32)
        self._init_flat({"user": (users, dim), "item": (items, dim), "item_bias": (items,)},
                        rng, {"user": 0.1, "item": 0.1, "item_bias": 0.0})

    def _batch(self, worker, step):
        rng = np.random.default_rng([self.seed, worker, step, 2])
        u = rng.integers(0, self.users, self.batch)
        i = rng.integers(0, self.items, self.batch)
        score = np.sum(self._true_u[u] * self._true_i[i], axis=1)
        y = (score > 0.5).astype(np.float32)
        return u, i, y

    def loss(self, worker, step):
        u, i, y = self._batch(worker, step)
        z = np.sum(self.user[u] * self.item[i], axis=1) + self.item_bias[i]
        return float(np.mean(np.logaddexp(0, z) - y * z))

    def gradient(self, worker, step):
        u, i, y = self._batch(worker, step)
        z = np.sum(self.user[u] * self.item[i], axis=1) + self.item_bias[i]
        dz = ((1 / (1 + np.exp(-z))) - y) / len(y)
        g_user = np.zeros_like(self.user)
        g_item = np.zeros_like(self.item)
        g_bias = np.zeros_like(self.item_bias)
        np.add.at(g_user, u, dz[:, None] * self.item[i])
        np.add.at(g_item, i, dz[:, None] * self.user[u])
        np.add.at(g_bias, i, dz)
        return self._flatten({"user": g_user, "item": g_item, "item_bias": g_bias})


WORKLOADS = {"mlp": DenseMLP, "ncf": NcfModel}
