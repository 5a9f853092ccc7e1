"""EAGLE training steps with the whole-vocabulary and the draft-vocabulary cross-entropy, timed
interleaved in one process (best of 3 over 24 examples of the shipped self corpus), and how much of
the model's probability the draft vocabulary holds on those examples.

    python benchmarks/eagle_train_speed.py
"""
import time, itertools, torch
torch.set_num_threads(2)
from ngspec.models import load_model
from ngspec.datastore.corpus import iter_records
from ngspec.eagle.train import examples_from_records, target_features, example_loss, output_weight, TrainOptions
from ngspec.eagle.head import EagleHead, head_config_for, init_from_target, ranked_tokens
lm = load_model(); model = lm.model
for p in model.parameters(): p.requires_grad_(False)
ex = examples_from_records(itertools.islice(iter_records('corpora/smollm2-self.jsonl'), 40), lm.tokenizer, 640)[:24]
feats = target_features(model, ex)
toks = sum(len(e.ids) for e in ex)
head = EagleHead(head_config_for(model)); init_from_target(head, model); head.train()
opts = TrainOptions()
res = {0: [], 8192: []}
for rep in range(3):
    for v in (0, 8192):
        w = output_weight(model, ex, v)
        t = time.perf_counter()
        for e, f in zip(ex, feats):
            loss, _ = example_loss(head, model, e, f, opts, w)
            loss.backward()
        res[v].append(time.perf_counter() - t)
for v, ts in res.items():
    print(f"ce_vocab={v}: {min(ts):.2f} s for {toks} tokens (forward+backward) -> {toks/min(ts):.0f} tokens/s")
with torch.no_grad():
    lm_head = model.get_output_embeddings()
    all_ex = examples_from_records(iter_records('corpora/smollm2-self.jsonl'), lm.tokenizer, 640)
    ids = set(t for t, _ in ranked_tokens(e.ids[e.prompt_len:].tolist() for e in all_ex)[:8192])
    mask = torch.zeros(lm_head.weight.shape[0], dtype=torch.bool); mask[list(ids)] = True
    shares = []
    for e, f in zip(ex, feats):
        p = torch.softmax(f[e.prompt_len:].float() @ lm_head.weight.T, -1)
        shares.append(p[:, mask].sum(-1))
    s = torch.cat(shares)
    print(f"probability mass inside the 8192-token vocabulary: mean {s.mean():.4f}, 5th percentile {s.quantile(0.05):.4f}")
