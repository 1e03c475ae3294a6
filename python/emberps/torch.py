"""emberps.torch: an embedding table kept on EmberPS servers, as a torch.nn.Module.

    from emberps.torch import EmbeddingBag
    emb = EmbeddingBag(client, "emb", dim=16, mode="sum")
    pooled = emb(keys)               # keys: int64 tensor (B, L), or 1-D with offsets (B,)
    loss.backward()                  # pushes the rows' gradients; the server's optimizer steps

DESIGN: forward takes the batch's keys (64-bit feature keys held in an int64 tensor: the bits
are the key, so keys >= 2^63 are negative numbers there), finds the unique ones (np.unique), pulls
their rows into one float32 array (or takes the rows a prefetch(keys) already pulled for the same
unique keys), and pools with torch.nn.functional.embedding_bag over that array, so forward and
backward are PyTorch's own kernels. The pulled rows enter autograd through _PushRows, an identity
whose backward receives the gradient of every unique row (duplicates summed by embedding_bag's
backward). A module called more than once in a step (one table for two features) gets a backward
of each call: their gradients are gathered, and at the end of the backward pass (a callback
queued on autograd's engine) summed per key and pushed to the servers with one call, so each
backward is one step of the table's server-side optimizer (before, each call's part was its own
step: with Adagrad not the same as one step of their sum). The module has no torch Parameter
and a torch optimizer only steps the dense layers.
The push is started in backward and not waited for there (the dense optimizer's step overlaps
it); a pull issued after backward returned still sees the update, because libpsclient sends a
server its requests in order on one connection and the server applies them in that order. The
push's result is taken at the next forward or flush(), which raise its error.
Imported on use: `import emberps` works without PyTorch.
"""
try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError as e:  # the package itself does not need torch
    raise ImportError("emberps.torch needs PyTorch (Debian 12: apt install python3-torch, then "
                      "use /usr/bin/python3): %s" % e) from None

import numpy as np


def keys_numpy(keys):
    """An int64 tensor of feature keys as the uint64 numpy array of the same bits (no copy for
    a contiguous CPU tensor)."""
    if not isinstance(keys, torch.Tensor):
        raise TypeError("keys must be a torch tensor, got %s" % type(keys).__name__)
    if keys.dtype != torch.int64:
        raise TypeError("keys must be an int64 tensor (the 64-bit keys' bits), got %s"
                        % keys.dtype)
    return keys.detach().cpu().contiguous().reshape(-1).numpy().view(np.uint64)


class _PushRows(torch.autograd.Function):
    """Identity on the pulled rows whose backward pushes their gradient to the servers."""

    @staticmethod
    def forward(ctx, rows, module, ukeys):
        ctx.module, ctx.ukeys = module, ukeys
        return rows.view_as(rows)

    @staticmethod
    def backward(ctx, grad):
        ctx.module._grad_in(ctx.ukeys, grad)
        return None, None, None


class EmbeddingBag(nn.Module):
    """Bags of keys -> pooled rows of `table` (dim `dim`) held by the servers of `client`.

    mode: "sum" or "mean", as torch.nn.EmbeddingBag. Input as torch.nn.EmbeddingBag: a 2-D
    int64 tensor (B, L) is B bags of L keys; a 1-D tensor needs offsets (B,) where each bag
    starts. per_sample_weights (mode "sum") weight each key. In training mode with gradients
    enabled, forward pulls the rows (a missing key gets its initial row) and backward pushes
    the unique rows' gradients (`last_push` keeps the servers' counters); in eval mode or under
    torch.no_grad() forward looks them up (nothing inserted; a missing key answers the table's
    missing-row policy, as ps-worker's evaluation) and nothing is pushed. The rows are fetched
    and pooled on the CPU; the result is on the input's device. Call flush() before evaluating
    or exiting: the last backward's push is otherwise still on its way.
    """

    def __init__(self, client, table, dim, mode="sum"):
        super().__init__()
        if mode not in ("sum", "mean"):
            raise ValueError("mode must be 'sum' or 'mean', got %r" % (mode,))
        if client.dim(table) != dim:
            raise ValueError("table %s has dim %d on the servers, not %d"
                             % (table, client.dim(table), dim))
        self.client, self.table, self.dim, self.mode = client, table, dim, mode
        self._ahead = []  # (unique keys, train, future of rows, pushes before it), oldest first
        self._pushes = 0  # pushes started: a prefetch from before the last one is stale
        self._pushing = None  # the future of the last push, until its result is taken
        self._last_push = None
        self._grads = []  # this backward pass's (unique keys, gradient), pushed at its end

    def extra_repr(self):
        return "table=%s, dim=%d, mode=%s" % (self.table, self.dim, self.mode)

    @property
    def last_push(self):
        """The servers' counters of the last push ({"applied", "skipped_nonfinite",
        "dropped_unadmitted"}; waits for it)."""
        self.flush()
        return self._last_push

    def flush(self):
        """Wait for the last backward's push; raise its error (an EmberError)."""
        fut, self._pushing = self._pushing, None
        if fut is not None:
            self._last_push = fut.result()

    def prefetch(self, keys):
        """Start fetching the rows of a coming batch's keys (any int64 tensor); its forward then
        uses them instead of fetching. Rows reflect every push started before this call; a
        backward after it (a push the rows may miss) makes it stale: forward then fetches again
        (a stale pull counted its keys' sightings for admission too). In training mode with
        gradients a pull (missing rows created), else a lookup (nothing inserted), as forward
        fetches them."""
        ukeys = np.unique(keys_numpy(keys))
        train = self.training and torch.is_grad_enabled()  # as forward decides
        fut = (self.client.pull_async(self.table, ukeys, self.dim) if train else
               self.client.lookup_async(self.table, ukeys, self.dim))
        self._ahead.append((ukeys, train, fut, self._pushes))
        while len(self._ahead) > 8:  # a prefetch never used is dropped (after it completed;
            self._ahead.pop(0)[2].exception()  # its error is not this call's)

    def _rows(self, ukeys, train):
        """The rows of ukeys: pulled when training (a missing key gets its initial row, and
        counts toward admission), else looked up (read-only: the test set inserts nothing and
        a missing key answers the table's missing-row policy, as ps-worker evaluates)."""
        while self._ahead and self._ahead[0][3] != self._pushes:  # stale ones come first
            self._ahead.pop(0)[2].exception()  # a push started after it: waited for, not used
        for i, (k, kind, fut, _) in enumerate(self._ahead):
            if kind == train and k.shape == ukeys.shape and np.array_equal(k, ukeys):
                del self._ahead[i]
                return fut.result() if train else fut.result()[0]
        if train:
            return self.client.pull(self.table, ukeys, self.dim)
        return self.client.lookup(self.table, ukeys, self.dim)[0]

    def _grad_in(self, ukeys, grad):
        """A call's gradient, from backward: kept until the backward pass ends (_push_pass). A
        callback is queued for every call (the first to run pushes them all, the others find
        nothing): a pass that failed runs none of its callbacks, and one queued only when the
        list was empty would never be queued again (the module would stop pushing)."""
        self._grads.append((ukeys, grad.detach().to("cpu", torch.float32)))
        torch.autograd.Variable._execution_engine.queue_callback(self._push_pass)

    def _push_pass(self):
        """The end of a backward pass: its calls' gradients, summed per key, in one push (with
        those of a pass that failed before its end, if any)."""
        parts, self._grads = self._grads, []
        if not parts:
            return
        if len(parts) == 1:
            ukeys, g = parts[0]
        else:
            ukeys, inverse = np.unique(np.concatenate([k for k, _ in parts]), return_inverse=True)
            g = torch.zeros((len(ukeys), self.dim), dtype=torch.float32)
            g.index_add_(0, torch.from_numpy(inverse.astype(np.int64)),
                         torch.cat([x for _, x in parts]))
        try:
            self._push(ukeys, g)
        except BaseException:  # (the last push's error, or this one refused): kept for the
            self._grads = parts + self._grads  # next pass, not dropped with the error
            raise

    def _push(self, ukeys, grad):
        self.flush()
        g = grad.contiguous().numpy()
        self._pushing = self.client.push_async(self.table, ukeys, g, self.dim)
        self._pushes += 1

    def forward(self, input, offsets=None, per_sample_weights=None):
        if input.dim() == 2:
            if offsets is not None:
                raise ValueError("offsets must be None with 2-D input")
            if not input.shape[1]:
                self.flush()  # (the last push's error, as any forward raises it)
                return torch.zeros((input.shape[0], self.dim), dtype=torch.float32,
                                   device=input.device)
        elif input.dim() == 1:
            if offsets is None:
                raise ValueError("1-D input needs offsets")
        else:
            raise ValueError("input must be 1-D or 2-D, got %d-D" % input.dim())
        self.flush()
        flat = keys_numpy(input)
        ukeys, inverse = np.unique(flat, return_inverse=True)
        train = self.training and torch.is_grad_enabled()
        rows = torch.from_numpy(self._rows(ukeys, train))
        if train:
            rows = _PushRows.apply(rows.requires_grad_(True), self, ukeys)
        idx = torch.from_numpy(inverse.astype(np.int64)).reshape(input.shape)
        # the rows live on the CPU: so do the bags; the result goes where the input was
        out = F.embedding_bag(idx, rows,
                              None if offsets is None else offsets.to("cpu", torch.int64),
                              mode=self.mode,
                              per_sample_weights=None if per_sample_weights is None else
                              per_sample_weights.to("cpu"))
        return out.to(input.device)
