#!/usr/bin/python3
"""PyTorch peer of the C++ encoder-decoder translation example (English -> French).

  torch_translation.py DIR [--steps 300 --batch 32 --d-model 128 --heads 4 --d-ff 512 --layers 2
                            --src-len 32 --tgt-len 32 --beam 4 --alpha 0.6 --csv C --json J ...]

DIR holds what the C++ example wrote: {train,dev,test}.{src,tgt} (SentencePiece ids, space
separated, no bos/eos), {train,dev,test}.{en,fr} (the raw lines) and tokenizer.model. Ids: pad 0,
unk 1, bos 2, eos 3.

The model is torch.nn.Transformer (pre-layer-norm blocks, final encoder and decoder layer norms)
made to compute what examples/translation/model.hpp does: no biases in the attention projections
and the feed-forward, sinusoidal positions (--positions learned: learned ones) added to the token
embeddings, the target embedding tied to the softmax weights with logits scaled by d_model**-0.5,
layer norm eps 1e-6, dropout on each sublayer's output only (none on attention probabilities, inside
the feed-forward or on the embeddings). Batches follow the C++ example's order exactly (splitmix64
permutations per epoch), so the two curves can be laid over each other. Trains with Adam, then
decodes the test split greedily and with beam search (the C++ example's algorithm, ties included)
and scores both with sacrebleu, next to the copy-the-source baseline.

Output: progress on stderr; the training curve to --csv; one JSON line on stdout (and to --json)
at the end. Threads: --threads (default 1), as one rank of the C++ example runs. Runs with Debian's
python3-torch (1.13) and sacrebleu.
"""
import argparse
import csv
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch starts its thread pool

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

PAD, UNK, BOS, EOS = 0, 1, 2, 3
LN_EPS = 1e-6  # meshtensor's layer norm epsilon (PyTorch's default is 1e-5)
MASK64 = (1 << 64) - 1


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- batch order (shared with C++)

def splitmix64(state):
    """Returns (new state, output): Vigna's splitmix64, with the state passed explicitly."""
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def permutation(n, seed):
    """Fisher-Yates from the back, j = splitmix64 % (i + 1): the C++ example's shuffle."""
    p = list(range(n))
    state = seed & MASK64
    for i in range(n - 1, 0, -1):
        state, r = splitmix64(state)
        j = r % (i + 1)
        p[i], p[j] = p[j], p[i]
    return p


def batch_order(n, batch, seed):
    """Yields the index lists of successive batches: epoch e is permutation(n, seed*1000003 + e),
    epochs concatenated, so a batch may straddle two epochs."""
    epoch, perm, pos = 0, permutation(n, seed * 1000003), 0
    while True:
        out = []
        while len(out) < batch:
            if pos == n:
                epoch += 1
                perm, pos = permutation(n, seed * 1000003 + epoch), 0
            take = min(batch - len(out), n - pos)
            out += perm[pos:pos + take]
            pos += take
        yield out


# ---------------------------------------------------------------- data

def read_lines(path):
    # newline="\n": split only on \n, keep any \r or U+2028 inside a raw text line as it is
    with open(path, encoding="utf-8", newline="\n") as f:
        text = f.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def read_ids(path):
    return [[int(t) for t in line.split()] for line in read_lines(path)]


class Split:
    def __init__(self, d, name, S, T):
        self.src_ids, self.tgt_ids = read_ids(f"{d}/{name}.src"), read_ids(f"{d}/{name}.tgt")
        self.en, self.fr = read_lines(f"{d}/{name}.en"), read_lines(f"{d}/{name}.fr")
        n = len(self.src_ids)
        if not (len(self.tgt_ids) == len(self.en) == len(self.fr) == n):
            sys.exit(f"{d}/{name}.*: line counts differ (src {n}, tgt {len(self.tgt_ids)}, "
                     f"en {len(self.en)}, fr {len(self.fr)})")
        self.n = n
        # the whole split as padded tensors once; a batch is then a row gather
        self.src = torch.zeros(n, S, dtype=torch.long)
        self.dec_in = torch.zeros(n, T, dtype=torch.long)
        self.labels = torch.zeros(n, T, dtype=torch.long)
        for i, (s, t) in enumerate(zip(self.src_ids, self.tgt_ids)):
            s = s[:S - 1] + [EOS]
            self.src[i, :len(s)] = torch.tensor(s)
            d_in, lab = [BOS] + t[:T - 1], t[:T - 1] + [EOS]
            self.dec_in[i, :len(d_in)] = torch.tensor(d_in)
            self.labels[i, :len(lab)] = torch.tensor(lab)

    def max_id(self):
        return max([max(x, default=0) for x in self.src_ids + self.tgt_ids], default=0)


def vocab_size(model_path):
    """The SentencePiece model's piece count: the python module if present, else spm_export_vocab."""
    try:
        import sentencepiece as spm
        return spm.SentencePieceProcessor(model_file=model_path).get_piece_size()
    except ImportError:
        pass
    if shutil.which("spm_export_vocab") is None:
        sys.exit("cannot read the vocabulary size: neither the sentencepiece module nor spm_export_vocab; "
                 "pass --vocab")
    out = subprocess.run(["spm_export_vocab", f"--model={model_path}"], check=True, capture_output=True)
    return out.stdout.count(b"\n")


def decode_ids(model_path, seqs):
    """Token id lists -> detokenized text lines."""
    try:
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=model_path)
        return [sp.decode(s) for s in seqs]
    except ImportError:
        pass
    text = "".join(" ".join(map(str, s)) + "\n" for s in seqs)
    out = subprocess.run(["spm_decode", f"--model={model_path}", "--input_format=id"], input=text,
                         capture_output=True, check=True, encoding="utf-8")
    lines = out.stdout.split("\n")[:len(seqs)]
    if len(lines) != len(seqs):
        sys.exit(f"spm_decode gave {len(lines)} lines for {len(seqs)} hypotheses")
    return lines


# ---------------------------------------------------------------- model

class BiasFreeAttention(torch.nn.MultiheadAttention):
    """nn.MultiheadAttention(bias=False) that always takes the unfused path: 1.13's fused eval-mode
    kernel (torch._native_multi_head_attention, taken when dropout is 0) requires a qkv bias."""

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True):
        # to [length, batch, D], keeping `query is key is value` so self-attention projects once
        q = query.transpose(0, 1)
        k = q if key is query else key.transpose(0, 1)
        v = k if value is key else value.transpose(0, 1)
        out, w = F.multi_head_attention_forward(
            q, k, v, self.embed_dim, self.num_heads, self.in_proj_weight, None, None, None, False,
            self.dropout, self.out_proj.weight, None, training=self.training, key_padding_mask=key_padding_mask,
            need_weights=need_weights, attn_mask=attn_mask, average_attn_weights=average_attn_weights)
        return out.transpose(0, 1), w


def sinusoids(n, d):
    """Vaswani et al.'s positions, as model.hpp's sinusoids(): pe[p, 2i] = sin(p / 10000^(2i/d)),
    pe[p, 2i+1] = cos(p / 10000^(2i/d)), computed in float64."""
    p = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(d)
    angle = p / torch.pow(10000.0, (i - i % 2).double() / d)
    return torch.where(i % 2 == 1, torch.cos(angle), torch.sin(angle)).float()


class Translator(torch.nn.Module):
    def __init__(self, V, D, H, F_, N, S, T, dropout, positions="sinusoid"):
        super().__init__()
        self.D, self.H = D, H
        self.src_emb = torch.nn.Parameter(torch.randn(V, D))
        self.tgt_emb = torch.nn.Parameter(torch.randn(V, D))  # also the softmax weights (tied)
        if positions == "learned":
            self.src_pos = torch.nn.Parameter(0.1 * torch.randn(S, D))
            self.tgt_pos = torch.nn.Parameter(0.1 * torch.randn(T, D))
        else:  # not parameters, as in the C++ model
            self.register_buffer("src_pos", sinusoids(S, D), persistent=False)
            self.register_buffer("tgt_pos", sinusoids(T, D), persistent=False)
        self.tf = torch.nn.Transformer(d_model=D, nhead=H, num_encoder_layers=N, num_decoder_layers=N,
                                       dim_feedforward=F_, dropout=dropout, activation="relu",
                                       layer_norm_eps=LN_EPS, batch_first=True, norm_first=True)
        # PyTorch 1.13's layers always have biases; swap in bias-free modules (layer norms keep theirs).
        # The C++ blocks drop out only the sublayers' outputs (the layers' dropout1/2/3): no dropout
        # on the attention probabilities nor after the feed-forward's ReLU.
        mha = lambda: BiasFreeAttention(D, H, dropout=0.0, bias=False, batch_first=True)  # noqa: E731
        for layer in list(self.tf.encoder.layers) + list(self.tf.decoder.layers):
            layer.self_attn = mha()
            if hasattr(layer, "multihead_attn"):
                layer.multihead_attn = mha()
            layer.linear1 = torch.nn.Linear(D, F_, bias=False)
            layer.linear2 = torch.nn.Linear(F_, D, bias=False)
            layer.dropout = torch.nn.Identity()
        for layer in self.tf.encoder.layers:
            # the eval-mode fused encoder layer (torch._transformer_encoder_layer_fwd) reads the biases
            # and fails on None; this flag only gates that path, the activation stays ReLU
            layer.activation_relu_or_gelu = 0
        for m in self.tf.modules():
            if isinstance(m, torch.nn.MultiheadAttention):
                torch.nn.init.normal_(m.in_proj_weight, 0.0, D ** -0.5)  # q, k, v: fan_in D
                torch.nn.init.normal_(m.out_proj.weight, 0.0, D ** -0.5)  # fan_in H * d_kv = D
        for layer in list(self.tf.encoder.layers) + list(self.tf.decoder.layers):
            torch.nn.init.normal_(layer.linear1.weight, 0.0, D ** -0.5)
            torch.nn.init.normal_(layer.linear2.weight, 0.0, F_ ** -0.5)
        self.register_buffer("causal", torch.nn.Transformer.generate_square_subsequent_mask(T), persistent=False)

    def encode(self, src):
        """src [b, S] -> (memory [b, S, D], source pad mask [b, S], True at pads)."""
        pad = src == PAD
        x = F.embedding(src, self.src_emb) + self.src_pos[:src.shape[1]]
        return self.tf.encoder(x, src_key_padding_mask=pad), pad

    def logits(self, y):
        return (y @ self.tgt_emb.t()) * self.D ** -0.5

    def forward(self, src, dec_in):
        mem, pad = self.encode(src)
        t = dec_in.shape[1]
        y = F.embedding(dec_in, self.tgt_emb) + self.tgt_pos[:t]
        y = self.tf.decoder(y, mem, tgt_mask=self.causal[:t, :t], memory_key_padding_mask=pad)
        return self.logits(y)


def param_count_formula(V, D, F_, N, S, T, positions):
    # embeddings 2VD; encoder block 4D^2 + 2DF + 2 norms; decoder block 8D^2 + 2DF + 3 norms; 2 final
    # norms; learned positions (S+T)D
    return 2 * V * D + N * (12 * D * D + 4 * D * F_ + 10 * D) + 4 * D + (S + T) * D * (positions == "learned")


def loss_sum(model, src, dec_in, labels, smoothing=0.0):
    """(sum of cross-entropy over non-pad labels, number of non-pad labels)."""
    lg = model(src, dec_in)
    s = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), labels.reshape(-1), ignore_index=PAD,
                        reduction="sum", label_smoothing=smoothing)
    return s, int((labels != PAD).sum())


@torch.no_grad()
def eval_loss(model, split, n, smoothing, chunk=128):
    """Mean cross-entropy per non-pad label over the first n pairs, without dropout (with the training
    loss's label smoothing, as the C++ example's dev loss)."""
    model.eval()
    tot, cnt = 0.0, 0
    for i in range(0, n, chunk):
        j = min(i + chunk, n)
        s, c = loss_sum(model, split.src[i:j], split.dec_in[i:j], split.labels[i:j], smoothing)
        tot, cnt = tot + s.item(), cnt + c
    model.train()
    return tot / max(cnt, 1)


# ---------------------------------------------------------------- incremental decoding

class DecoderState:
    """The decoder run one position at a time: per layer the self-attention keys and values of the
    positions so far, and the cross-attention keys and values of the encoder output computed once.
    Uses the nn.Transformer modules' own weights (eval mode: no dropout)."""

    def __init__(self, model, mem, pad):
        self.m, self.t = model, 0
        D, H = model.D, model.H
        self.H, self.dk = H, D // H
        self.mask = torch.zeros(pad.shape, dtype=mem.dtype).masked_fill(pad, float("-inf"))[:, None, None, :]
        self.self_kv, self.cross_kv = [], []
        for layer in model.tf.decoder.layers:
            w = layer.multihead_attn.in_proj_weight
            k, v = F.linear(mem, w[D:2 * D]), F.linear(mem, w[2 * D:])
            self.cross_kv.append((self.heads(k), self.heads(v)))
            self.self_kv.append(None)

    def heads(self, x):  # [r, l, D] -> [r, H, l, dk]
        return x.view(x.shape[0], x.shape[1], self.H, self.dk).transpose(1, 2)

    def attend(self, q, k, v, mha, mask=None):
        a = (self.heads(q) / math.sqrt(self.dk)) @ k.transpose(-1, -2)  # [r, H, 1, l]
        if mask is not None:
            a = a + mask
        o = torch.softmax(a, dim=-1) @ v  # [r, H, 1, dk]
        return F.linear(o.transpose(1, 2).reshape(q.shape[0], 1, -1), mha.out_proj.weight)

    def step(self, tok):
        """tok [r]: the tokens at position t -> log-probabilities [r, V] (float64, as the C++ example
        takes them from its float logits) of the token at position t + 1."""
        m, D = self.m, self.m.D
        x = (F.embedding(tok, m.tgt_emb) + m.tgt_pos[self.t])[:, None, :]  # [r, 1, D]
        for i, layer in enumerate(m.tf.decoder.layers):
            q, k, v = F.linear(layer.norm1(x), layer.self_attn.in_proj_weight).split(D, dim=-1)
            k, v = self.heads(k), self.heads(v)
            if self.self_kv[i] is not None:  # causal: the new position sees all earlier ones
                k, v = torch.cat([self.self_kv[i][0], k], 2), torch.cat([self.self_kv[i][1], v], 2)
            self.self_kv[i] = (k, v)
            x = x + self.attend(q, k, v, layer.self_attn)
            q = F.linear(layer.norm2(x), layer.multihead_attn.in_proj_weight[:D])
            x = x + self.attend(q, *self.cross_kv[i], layer.multihead_attn, self.mask)
            x = x + layer.linear2(F.relu(layer.linear1(layer.norm3(x))))
        self.t += 1
        return torch.log_softmax(m.logits(m.tf.decoder.norm(x[:, 0])).double(), dim=-1)

    def select(self, rows):
        """Keeps (and reorders, repeats) the rows `rows` of every cache."""
        self.mask = self.mask[rows]
        self.self_kv = [kv and (kv[0][rows], kv[1][rows]) for kv in self.self_kv]  # None before step 0
        self.cross_kv = [(k[rows], v[rows]) for k, v in self.cross_kv]


@torch.no_grad()
def greedy(model, src, T):
    """src [b, S] -> b token lists (eos dropped): argmax at each position, at most T tokens."""
    model.eval()
    st = DecoderState(model, *model.encode(src))
    b = src.shape[0]
    tok = torch.full((b,), BOS, dtype=torch.long)
    out, done = [[] for _ in range(b)], torch.zeros(b, dtype=torch.bool)
    for _ in range(T):
        tok = st.step(tok).argmax(-1)
        for i in (~done).nonzero().flatten().tolist():
            if tok[i].item() != EOS:
                out[i].append(tok[i].item())
        done |= tok == EOS
        if done.all():
            break
    return out


def length_penalty(n, alpha):
    return ((5.0 + n) / 6.0) ** alpha


@torch.no_grad()
def beam_search(model, src, T, K, alpha):
    """src [b, S] -> b token lists (eos dropped). The C++ example's beam_decode:

    Per sentence up to K live hypotheses. At each position the K best continuations of the live ones
    by total log-probability are taken (ties: the lower hypothesis slot, then the lower token id).
    A continuation that is eos, or any at position T, ends its hypothesis, which scores total /
    ((5 + len) / 6)**alpha (len counting the eos) and replaces the sentence's best if strictly
    better; the others are the next live hypotheses. A sentence stops when none is live or its best
    score is at least what the best live one could still reach (its total over the penalty of
    length T). The answer is the best finished hypothesis. With K = 1 this is greedy decoding."""
    model.eval()
    b = src.shape[0]
    st = DecoderState(model, *model.encode(src))
    st.select(torch.arange(b).repeat_interleave(K))  # rows a*K .. a*K+K-1 are sentence a's slots
    total = torch.full((b, K), float("-inf"), dtype=torch.float64)  # -inf: the slot is not live
    total[:, 0] = 0.0
    seqs = [[[] for _ in range(K)] for _ in range(b)]
    tok = torch.full((b * K,), BOS, dtype=torch.long)
    sent = list(range(b))  # the sentence of each active group of K rows
    best, best_score = [[] for _ in range(b)], [float("-inf")] * b
    largest_penalty = length_penalty(T, alpha)
    for p in range(T):
        logp = st.step(tok)
        V = logp.shape[-1]
        cand = (total.reshape(-1, 1) + logp).reshape(len(sent), K * V)  # index: slot * V + token
        kth = cand.topk(min(K, K * V), dim=1).values[:, -1]
        rows, totals, toks, new_sent, new_seqs = [], [], [], [], []
        for a, s in enumerate(sent):
            # the K best, ties to the lower index (nonzero is ascending, the sort stable)
            idx = (cand[a] >= kth[a]).nonzero().flatten()
            idx = idx[torch.sort(cand[a, idx], descending=True, stable=True).indices[:K]].tolist()
            live, best_live = [], float("-inf")
            for c in idx:
                tot = cand[a, c].item()
                if tot == float("-inf"):  # a continuation of a slot that is not live
                    continue
                j, v = divmod(c, V)
                if v == EOS or p + 1 == T:
                    score = tot / length_penalty(len(seqs[a][j]) + 1, alpha)
                    if score > best_score[s]:
                        best_score[s], best[s] = score, seqs[a][j] + ([] if v == EOS else [v])
                    continue
                live.append((j, v, tot))
                best_live = max(best_live, tot)
            if not live or best_score[s] >= best_live / largest_penalty:
                continue  # done
            live += [(live[0][0], PAD, float("-inf"))] * (K - len(live))  # idle slots
            rows += [a * K + j for j, _, _ in live]
            toks += [v for _, v, _ in live]
            totals.append([t_ for _, _, t_ in live])
            new_seqs.append([seqs[a][j] + [v] for j, v, _ in live])
            new_sent.append(s)
        if not new_sent:
            break
        st.select(torch.tensor(rows))
        total, tok = torch.tensor(totals, dtype=torch.float64), torch.tensor(toks)
        seqs, sent = new_seqs, new_sent
    return best


def decode_split(model, split, n, T, beam, alpha, chunk):
    out = []
    for i in range(0, n, chunk):
        src = split.src[i:min(i + chunk, n)]
        out += greedy(model, src, T) if beam == 0 else beam_search(model, src, T, beam, alpha)
    return out


# ---------------------------------------------------------------- checks

def self_check(model, args, train, test):
    """Asserts the pieces the comparison with the C++ example relies on."""
    # splitmix64 from state 0: the first outputs of Vigna's reference code (corpus_test.cpp's too)
    state, got = 0, []
    for _ in range(3):
        state, z = splitmix64(state)
        got.append(z)
    assert got == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F], [hex(z) for z in got]
    first = next(batch_order(train.n, args.batch, args.seed))
    log(f"self-check: permutation(10, 1) = {permutation(10, 1)}; first batch of seed {args.seed}: {first[:8]}...")
    # incremental decoding gives the full decoder's log-probabilities
    k = min(16, test.n)
    src, dec_in = test.src[:k], test.dec_in[:k]
    model.eval()
    with torch.no_grad():
        full = torch.log_softmax(model(src, dec_in), dim=-1)
        st = DecoderState(model, *model.encode(src))
        inc = torch.stack([st.step(dec_in[:, t]) for t in range(dec_in.shape[1])], 1)
    diff = (full - inc).abs().max().item()
    log(f"self-check: incremental vs full decoder log-probs, max |diff| {diff:.2e}")
    assert diff < 1e-4, diff
    # beam 1 is greedy
    g = greedy(model, src, args.tgt_len)
    b1 = beam_search(model, src, args.tgt_len, 1, args.alpha)
    log(f"self-check: greedy == beam 1 on {k} test sentences: {g == b1}")
    assert g == b1, (g, b1)
    model.train()


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="the directory the C++ example wrote its data and tokenizer.model to")
    ap.add_argument("--d-model", type=int, default=128, help="d_model D (default 128)")
    ap.add_argument("--heads", type=int, default=4, help="attention heads H; d_kv = D / H (default 4)")
    ap.add_argument("--d-ff", type=int, default=512, help="feed-forward width F (default 512)")
    ap.add_argument("--layers", type=int, default=2, help="N encoder and N decoder blocks (default 2)")
    ap.add_argument("--src-len", type=int, default=32, help="source length S, eos included (default 32)")
    ap.add_argument("--tgt-len", type=int, default=32, help="target length T, bos/eos included (default 32)")
    ap.add_argument("--vocab", type=int, default=0, help="vocabulary size V (default: read from tokenizer.model)")
    ap.add_argument("--positions", choices=["sinusoid", "learned"], default="sinusoid",
                    help="sinusoidal positions, no parameters (the C++ model's; default), or learned ones "
                         "initialised normal(0, 0.1)")
    ap.add_argument("--dropout", type=float, default=0.1, help="dropout rate (default 0.1)")
    ap.add_argument("--label-smoothing", type=float, default=0.0,
                    help="label smoothing of the training and dev losses (default 0)")
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam's constant learning rate (default 1e-3)")
    ap.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    ap.add_argument("--batch", type=int, default=32, help="sentence pairs per step (default 32)")
    ap.add_argument("--seed", type=int, default=1,
                    help="seed of the batch order and of torch's init and dropout (default 1)")
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the median step time (default 5)")
    ap.add_argument("--log-every", type=int, default=50, help="write a curve row every this many steps (default 50)")
    ap.add_argument("--eval-every", type=int, default=0,
                    help="dev loss every this many steps, and always after the last (default 0: only at the end)")
    ap.add_argument("--dev-sentences", type=int, default=256,
                    help="the dev loss is over the first this many dev pairs (default 256, the C++ default; 0: all)")
    ap.add_argument("--beam", type=int, default=4, help="beam width of the beam-search decode (default 4)")
    ap.add_argument("--alpha", type=float, default=0.6,
                    help="length penalty exponent: ((5+len)/6)**alpha (default 0.6)")
    ap.add_argument("--decode-limit", type=int, default=0,
                    help="decode and score the first K test sentences (default 0: all)")
    ap.add_argument("--decode-batch", type=int, default=64, help="test sentences decoded together (default 64)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1, one rank's worth)")
    ap.add_argument("--csv", help="write the training curve here (step, loss, loss_avg, dev_loss, seconds)")
    ap.add_argument("--json", help="also write the final JSON line here")
    ap.add_argument("--self-check", action="store_true",
                    help="after training, assert splitmix64's reference value, incremental == full decoder, "
                         "and beam 1 == greedy on a few test sentences")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    D, H, F_, N, S, T = args.d_model, args.heads, args.d_ff, args.layers, args.src_len, args.tgt_len
    if D % H:
        sys.exit(f"--d-model {D} is not a multiple of --heads {H}")
    spm_model = os.path.join(args.dir, "tokenizer.model")
    V = args.vocab or vocab_size(spm_model)
    t0 = time.perf_counter()
    train, dev, test = (Split(args.dir, s, S, T) for s in ("train", "dev", "test"))
    top = max(sp.max_id() for sp in (train, dev, test))
    if top >= V:
        sys.exit(f"the data has id {top} but the vocabulary has {V} pieces")
    log(f"data: train {train.n}, dev {dev.n}, test {test.n} pairs, vocab {V} ({time.perf_counter() - t0:.1f} s)")

    model = Translator(V, D, H, F_, N, S, T, args.dropout, args.positions)
    params = sum(p.numel() for p in model.parameters())
    formula = param_count_formula(V, D, F_, N, S, T, args.positions)
    assert params == formula, (params, formula)
    log(f"params {params} = 2VD + N(12D^2 + 4DF + 10D) + 4D" + (" + (S+T)D" if args.positions == "learned" else "")
        + f" ({args.positions} positions); torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9)

    rows, times, window = [], [], []
    order = batch_order(train.n, args.batch, args.seed)
    model.train()
    t_train = time.perf_counter()
    dev_loss = None
    n_dev = dev.n if args.dev_sentences <= 0 else min(args.dev_sentences, dev.n)
    for step in range(1, args.steps + 1):
        t1 = time.perf_counter()  # the batch's assembly counts, as in the C++ example's step time
        idx = torch.tensor(next(order))
        src, dec_in, labels = train.src[idx], train.dec_in[idx], train.labels[idx]
        opt.zero_grad(set_to_none=True)
        s, c = loss_sum(model, src, dec_in, labels, args.label_smoothing)
        loss = s / c
        loss.backward()
        opt.step()
        loss = loss.item()
        times.append(time.perf_counter() - t1)
        window.append(loss)
        do_eval = step == args.steps or (args.eval_every and step % args.eval_every == 0)
        if do_eval:
            dev_loss = eval_loss(model, dev, n_dev, args.label_smoothing)
        if do_eval or step % args.log_every == 0 or step == 1:
            row = {"step": step, "loss": loss, "loss_avg": sum(window) / len(window),
                   "dev_loss": dev_loss if do_eval else "", "seconds": time.perf_counter() - t_train}
            rows.append(row)
            window = []
            log(f"step {step:6d}  loss {loss:.4f}  avg {row['loss_avg']:.4f}"
                + (f"  dev {dev_loss:.4f}" if do_eval else "") + f"  {1e3 * times[-1]:.1f} ms/step")
    train_s = time.perf_counter() - t_train
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["step", "loss", "loss_avg", "dev_loss", "seconds"])
            w.writeheader()
            w.writerows(rows)
    timed = times[args.warmup:] or times
    median_ms = 1e3 * statistics.median(timed) if timed else float("nan")

    if args.self_check:
        self_check(model, args, train, test)

    import sacrebleu  # only needed here; keeps --help working without it
    k = test.n if args.decode_limit <= 0 else min(args.decode_limit, test.n)
    refs = test.fr[:k]
    result = {"name": "translation/torch", "params": params, "steps": args.steps, "batch": args.batch,
              "d_model": D, "heads": H, "d_ff": F_, "layers": N, "vocab": V, "src_len": S, "tgt_len": T,
              "threads": torch.get_num_threads(), "median_step_ms": median_ms, "train_seconds": train_s,
              "final_train_loss": rows[-1]["loss"] if rows else None,
              "final_train_loss_avg": rows[-1]["loss_avg"] if rows else None,
              "dev_loss": dev_loss, "dev_sentences": n_dev, "positions": args.positions, "decode_sentences": k,
              "beam": args.beam, "alpha": args.alpha}
    for name, beam in (("greedy", 0), ("beam", args.beam)):
        t1 = time.perf_counter()
        hyps = decode_ids(spm_model, decode_split(model, test, k, T, beam, args.alpha, args.decode_batch))
        result[f"bleu_{name}"] = sacrebleu.corpus_bleu(hyps, [refs]).score
        result[f"decode_{name}_seconds"] = time.perf_counter() - t1
        log(f"{name}: BLEU {result[f'bleu_{name}']:.2f} ({result[f'decode_{name}_seconds']:.1f} s); "
            f"first: {hyps[0]!r}" if hyps else "")
    result["bleu_copy"] = sacrebleu.corpus_bleu(test.en[:k], [refs]).score
    result["torch"] = torch.__version__
    line = json.dumps(result)
    print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
