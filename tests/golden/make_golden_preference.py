#!/usr/bin/python3
"""PyTorch reference data for fdtrain's preference objectives (DPO, SimPO, ORPO).

The policy is tests/golden/llama/llama3 (read from its model.safetensors), run
by make_golden_llama.py's decoder (imported, not copied). The script writes
tests/golden/preference/:

  reference/config.json        llama3's config, unchanged
  reference/model.safetensors  the reference model: the policy's parameters plus
                               normal(0, REF_NOISE) noise (seed REF_SEED)
  golden.json                  the pairs; per pair the policy's and the
                               reference's summed completion log-probs, counts
                               and the chosen sequence's NLL; per objective
                               configuration the loss and every TRL metric
  grads.safetensors            d loss / d every policy parameter for the
                               configurations in GRAD_CASES, Hugging Face names

Every sequence (prompt + completion) runs alone from position 0, in float32 on
the CPU (as fdtrain computes); a token's log-prob is
log_softmax(logits[t - 1])[id[t]] in float32, and everything after it (the
sums, the objectives, the metrics) is float64, written out here from
shared/REFERENCE.md's "Preference objectives" (current TRL, 0.29 and later),
not ported from fdtrain. Gradients come from torch autograd through that
float64 tail into the float32 model. Each case is recomputed with float64
models to show how far float32 is from the exact result (printed, and stored
as loss_fp64).

Run with Debian's interpreter (it has python3-torch):
    /usr/bin/python3 tests/golden/make_golden_preference.py
See tests/golden/README.md for what the files hold.
"""

import os

# OpenBLAS picks its GEMM kernels by CPU; the Haswell (AVX2) kernels are the
# ones the committed golden files were made with, on any x86-64 with AVX2.
os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")

import copy  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import struct  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden_llama as mgl  # noqa: E402

POLICY_CASE = "llama3"
REF_SEED = 3848
REF_NOISE = 0.02
PAIR_SEED = 38
# (prompt, chosen completion, rejected completion) token counts. Pair 3's
# rejected completion is its chosen one (a tie: rewards/accuracies counts 0).
LENGTHS = [(3, 4, 2), (1, 3, 5), (6, 1, 2), (2, 3, 3), (4, 6, 1)]
SAME_PAIR = 3

# The configurations. nll: which chosen tokens the NLL term covers (TRL's
# ORPO scores prompt and answer, its CPO/SimPO the answer).
CASES = [
    {"name": "dpo_sigmoid", "objective": "dpo", "dpo_loss": "sigmoid", "beta": 0.1},
    {"name": "dpo_ipo", "objective": "dpo", "dpo_loss": "ipo", "beta": 0.1},
    {"name": "dpo_hinge", "objective": "dpo", "dpo_loss": "hinge", "beta": 0.1},
    {"name": "dpo_robust", "objective": "dpo", "dpo_loss": "robust", "beta": 0.1,
     "label_smoothing": 0.2},
    {"name": "simpo", "objective": "simpo", "beta": 2.0, "gamma": 0.5,
     "label_smoothing": 0.0, "cpo_alpha": 0.0},
    {"name": "simpo_cpo", "objective": "simpo", "beta": 2.0, "gamma": 1.0,
     "label_smoothing": 0.1, "cpo_alpha": 0.5},
    {"name": "orpo", "objective": "orpo", "beta": 0.1},
]
GRAD_CASES = ("dpo_sigmoid", "simpo_cpo", "orpo")


def read_safetensors(path):
    """Minimal reader for the F32 files make_golden_llama.py writes: {name: tensor}, in order."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8 : 8 + n])
    data = blob[8 + n :]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", (path, name, e["dtype"])
        a, b = e["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype="<f4").copy()
        out[name] = torch.from_numpy(arr).reshape(e["shape"])
    return out


def load_policy(case_dir):
    with open(os.path.join(case_dir, "config.json")) as f:
        cfg = json.load(f)
    model = mgl.ForCausalLM(mgl.Arch(cfg))
    weights = read_safetensors(os.path.join(case_dir, "model.safetensors"))
    names = [n for n, _ in model.named_parameters()]
    assert names == list(weights), "the policy file holds the decoder's parameters, in order"
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(weights[n])
    return cfg, model


def make_reference(policy):
    """The policy plus normal(0, REF_NOISE) noise, drawn in named_parameters() order."""
    ref = copy.deepcopy(policy)
    gen = torch.Generator().manual_seed(REF_SEED)
    with torch.no_grad():
        for _, p in ref.named_parameters():
            p.add_(REF_NOISE * torch.randn(p.shape, generator=gen, dtype=torch.float32))
    return ref


def make_pairs(vocab):
    gen = torch.Generator().manual_seed(PAIR_SEED)
    pairs = []
    for i, (np_, nc, nr) in enumerate(LENGTHS):
        prompt = torch.randint(0, vocab, (np_,), generator=gen).tolist()
        chosen = torch.randint(0, vocab, (nc,), generator=gen).tolist()
        rejected = torch.randint(0, vocab, (nr,), generator=gen).tolist()
        if i == SAME_PAIR:
            rejected = list(chosen)
        pairs.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return pairs


def token_logps(model, ids):
    """log_softmax(logits[t - 1])[ids[t]] for t = 1 .. n - 1, in the model's dtype: (n - 1,)."""
    x = torch.tensor([ids], dtype=torch.int64)
    logits = model(x)[0]
    lp = F.log_softmax(logits, dim=-1)
    return lp[:-1].gather(1, x[0, 1:, None])[:, 0]


def summaries(model, pairs):
    """Per pair, float64 (with the autograd graph back to the model's parameters):
    logp_c, logp_r the summed completion log-probs; n_c, n_r; nll_c the chosen
    completion's NLL sum; nll_pc the chosen prompt + completion's NLL sum and
    its count n_pc (token indices 1 .. n - 1)."""
    out = []
    for pr in pairs:
        p = len(pr["prompt"])
        lc = token_logps(model, pr["prompt"] + pr["chosen"]).double()
        lr = token_logps(model, pr["prompt"] + pr["rejected"]).double()
        # Token t of the sequence is lc[t - 1]: the completion is t >= p.
        out.append({
            "logp_c": lc[p - 1 :].sum(),
            "logp_r": lr[p - 1 :].sum(),
            "n_c": len(pr["chosen"]),
            "n_r": len(pr["rejected"]),
            "nll_c": -lc[p - 1 :].sum(),
            "nll_pc": -lc.sum(),
            "n_pc": lc.numel(),
            "token_logps_c": lc,
            "token_logps_r": lr,
        })
    return out


def objective(case, pol, ref):
    """The loss (0-d float64, with its graph) and TRL's metrics (floats)."""
    kind = case["objective"]
    beta = case["beta"]
    eps = case.get("label_smoothing", 0.0)
    lc = torch.stack([s["logp_c"] for s in pol])
    lr = torch.stack([s["logp_r"] for s in pol])
    nc = torch.tensor([s["n_c"] for s in pol], dtype=torch.float64)
    nr = torch.tensor([s["n_r"] for s in pol], dtype=torch.float64)
    m = {}
    if kind == "dpo":
        cl = lc - torch.tensor([s["logp_c"].item() for s in ref], dtype=torch.float64)
        rl = lr - torch.tensor([s["logp_r"].item() for s in ref], dtype=torch.float64)
        x = beta * (cl - rl)
        lt = case["dpo_loss"]
        if lt == "sigmoid":  # current TRL ignores label_smoothing here
            per = -F.logsigmoid(x)
        elif lt == "robust":
            per = (-(1 - eps) * F.logsigmoid(x) + eps * F.logsigmoid(-x)) / (1 - 2 * eps)
        elif lt == "hinge":
            per = torch.relu(1 - x)
        elif lt == "ipo":
            per = (cl / nc - rl / nr - 1 / (2 * beta)) ** 2
        else:
            raise ValueError(lt)
        loss = per.mean()
        rc, rr = beta * cl, beta * rl
        logps_c, logps_r = lc, lr
    elif kind == "simpo":
        c, r = lc / nc, lr / nr
        z = (c - r) - case["gamma"] / beta
        per = -(1 - eps) * F.logsigmoid(beta * z) - eps * F.logsigmoid(-beta * z)
        loss = per.mean()
        alpha = case.get("cpo_alpha", 0.0)
        if alpha != 0.0:
            nll = torch.stack([s["nll_c"] for s in pol]).sum() / nc.sum()
            loss = loss + alpha * nll
            m["nll_loss"] = nll.item()
        rc, rr = beta * c, beta * r
        logps_c, logps_r = c, r
    elif kind == "orpo":
        c, r = lc / nc, lr / nr
        log_odds = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
        ratio = F.logsigmoid(log_odds)
        nll = torch.stack([s["nll_pc"] for s in pol]).sum() / sum(s["n_pc"] for s in pol)
        loss = nll - (beta * ratio).mean()
        m["nll_loss"] = nll.item()
        m["log_odds_ratio"] = ratio.mean().item()
        m["log_odds_chosen"] = log_odds.mean().item()
        rc, rr = beta * c, beta * r
        logps_c, logps_r = c, r
    else:
        raise ValueError(kind)
    m["rewards/chosen"] = rc.mean().item()
    m["rewards/rejected"] = rr.mean().item()
    m["rewards/accuracies"] = (rc > rr).double().mean().item()  # strict: a tie counts 0
    m["rewards/margins"] = (rc - rr).mean().item()
    m["logps/chosen"] = logps_c.mean().item()
    m["logps/rejected"] = logps_r.mean().item()
    return loss, dict(sorted(m.items()))


def options_json(case):
    o = {k: v for k, v in case.items() if k != "name"}
    o.setdefault("label_smoothing", 0.0)
    if case["objective"] == "simpo":
        o.setdefault("gamma", 0.5)
        o.setdefault("cpo_alpha", 0.0)
    return o


def nll_scope(case):
    if case["objective"] == "orpo":
        return "prompt+completion"
    if case["objective"] == "simpo" and case.get("cpo_alpha", 0.0) != 0.0:
        return "completion"
    return "none"


def summary_json(s):
    return {
        "logp_c": s["logp_c"].item(),
        "logp_r": s["logp_r"].item(),
        "n_c": s["n_c"],
        "n_r": s["n_r"],
        "nll_c": s["nll_c"].item(),
        "nll_pc": s["nll_pc"].item(),
        "n_pc": s["n_pc"],
        "token_logps_c": s["token_logps_c"].tolist(),
        "token_logps_r": s["token_logps_r"].tolist(),
    }


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-300)


def main():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    here = os.path.dirname(os.path.abspath(__file__))
    out_dir = os.path.join(here, "preference")
    cfg, policy = load_policy(os.path.join(here, "llama", POLICY_CASE))
    reference = make_reference(policy)
    policy64 = copy.deepcopy(policy).double()
    reference64 = copy.deepcopy(reference).double()
    pairs = make_pairs(cfg["vocab_size"])
    params = list(policy.named_parameters())

    with torch.no_grad():
        ref = summaries(reference, pairs)
        ref64 = summaries(reference64, pairs)
        pol_values = summaries(policy, pairs)

    cases = []
    grads = []
    for case in CASES:
        policy.zero_grad(set_to_none=True)
        loss, metrics = objective(case, summaries(policy, pairs), ref)
        loss.backward()
        policy64.zero_grad(set_to_none=True)
        loss64, metrics64 = objective(case, summaries(policy64, pairs), ref64)
        loss64.backward()
        entry = {
            "name": case["name"],
            "options": options_json(case),
            "nll": nll_scope(case),
            "loss": loss.item(),
            "metrics": metrics,
            "loss_fp64": loss64.item(),
            "metrics_fp64": metrics64,
            "grads": case["name"] in GRAD_CASES,
        }
        cases.append(entry)
        grad_note = ""
        if entry["grads"]:
            grads += [(f"{case['name']}.grad.{n}", p.grad.detach().clone()) for n, p in params]
            g64 = dict(policy64.named_parameters())
            worst_g = max((mgl.rel(p.grad, g64[n].grad), n) for n, p in params)
            grad_note = f"; worst grad rel fp32/fp64 {worst_g[0]:.2e} ({worst_g[1]})"
        worst = max((rel(metrics[k], metrics64[k]), k) for k in metrics if metrics64[k] != 0)
        print(f"{case['name']:12s} loss {loss.item():.10f} fp64 {loss64.item():.10f} rel "
              f"{rel(loss.item(), loss64.item()):.2e}; worst metric rel fp32/fp64 {worst[0]:.2e} "
              f"({worst[1]}){grad_note}")

    # DPO sigmoid against itself: the policy as its own reference.
    with torch.no_grad():
        same_loss, same_metrics = objective(CASES[0], pol_values, pol_values)
    assert abs(same_loss.item() - math.log(2)) < 1e-15, same_loss.item()
    print(f"policy = reference: loss {same_loss.item():.17g} (ln 2 = {math.log(2):.17g})")

    golden = {
        "about": "tests/golden/make_golden_preference.py; see tests/golden/README.md",
        "policy": f"../llama/{POLICY_CASE}",
        "reference": "reference",
        "ref_seed": REF_SEED,
        "ref_noise": REF_NOISE,
        "pair_seed": PAIR_SEED,
        "torch_version": torch.__version__,
        "pairs": pairs,
        "policy_summaries": [summary_json(s) for s in pol_values],
        "reference_summaries": [summary_json(s) for s in ref],
        "cases": cases,
        "policy_equals_reference": {
            "name": "dpo_sigmoid_self",
            "options": options_json(CASES[0]),
            "loss": same_loss.item(),
            "metrics": same_metrics,
        },
    }

    os.makedirs(os.path.join(out_dir, "reference"), exist_ok=True)
    with open(os.path.join(here, "llama", POLICY_CASE, "config.json"), "rb") as f:
        config_bytes = f.read()  # the same architecture: the policy's config, byte for byte
    with open(os.path.join(out_dir, "reference", "config.json"), "wb") as f:
        f.write(config_bytes)
    mgl.write_safetensors(
        os.path.join(out_dir, "reference", "model.safetensors"),
        [(n, p.detach().clone()) for n, p in reference.named_parameters()],
        {"format": "pt"},
    )
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    mgl.write_safetensors(
        os.path.join(out_dir, "grads.safetensors"),
        grads,
        {"format": "pt", "cases": json.dumps(GRAD_CASES), "torch_version": torch.__version__},
    )
    for i, (pr, s, r) in enumerate(zip(pairs, pol_values, ref)):
        print(f"pair {i}: prompt {len(pr['prompt'])} chosen {s['n_c']} rejected {s['n_r']}; "
              f"policy {s['logp_c'].item():.6f} {s['logp_r'].item():.6f}; reference "
              f"{r['logp_c'].item():.6f} {r['logp_r'].item():.6f}")


if __name__ == "__main__":
    main()
