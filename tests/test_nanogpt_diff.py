"""The README's change to a nanoGPT model, checked on nanoGPT's own file: the diff under *Your own
model* applied to ``examples/nanogpt/model.py`` (Karpathy's nanoGPT, commit 3adf61e1, unchanged)
gives ``examples/gpt.py`` line for line; the changed model with one candidate ``("pre",)`` is
nanoGPT's, loss for loss, with and without biases; with three it searches; ``autoln.Site``
refuses a 0-based ``layer``; and DeepNorm's init finds a block's branch weights by itself."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import autoln
from autoln.space.placements import deepnorm_constants

from .conftest import ROOT

NANOGPT = ROOT / "examples" / "nanogpt" / "model.py"
EXAMPLE = ROOT / "examples" / "gpt.py"
DIFF = ROOT / "examples" / "nanogpt" / "autoln.diff"


def readme_diff() -> str:
    """The first ```diff block of the README's *Your own model* section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Your own model", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```diff\n(.*?)```", section, re.S)
    assert match, "the README's 'Your own model' has no ```diff block"
    return match.group(1)


def apply_unified_diff(original: str, diff: str) -> str:
    """``original`` with the hunks of the unified ``diff`` applied; every context and removed line
    must match where its hunk header says (a strict ``patch``)."""
    lines = original.splitlines(keepends=True)
    out: list[str] = []
    pos = 0  # next unread line of original (0-based)
    body = diff.splitlines(keepends=True)
    i = 0
    while i < len(body) and not body[i].startswith("@@"):
        assert body[i].startswith(("---", "+++")), f"unexpected line before the first hunk: {body[i]!r}"
        i += 1
    while i < len(body):
        m = re.match(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", body[i])
        assert m, f"not a hunk header: {body[i]!r}"
        start = int(m.group(1)) - 1
        assert start >= pos, "hunks out of order"
        out.extend(lines[pos:start])
        pos = start
        i += 1
        while i < len(body) and not body[i].startswith("@@"):
            tag, text = body[i][:1], body[i][1:]
            if body[i] in ("\n", ""):  # an empty context line whose leading space an editor dropped
                tag, text = " ", "\n"
            if tag in (" ", "-"):
                assert lines[pos] == text, f"line {pos + 1}: diff expects {text!r}, file has {lines[pos]!r}"
                pos += 1
                if tag == " ":
                    out.append(text)
            else:
                assert tag == "+", f"bad diff line {body[i]!r}"
                out.append(text)
            i += 1
    out.extend(lines[pos:])
    return "".join(out)


def load(path: Path, name: str):
    """Import the file ``path`` as the module ``name`` (registered in ``sys.modules``: dataclasses
    look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    """The README's diff applied to nanoGPT's model.py, written to a folder and imported."""
    path = tmp_path_factory.mktemp("patched") / "model.py"
    path.write_text(apply_unified_diff(NANOGPT.read_text(encoding="utf-8"), DIFF.read_text(encoding="utf-8")), encoding="utf-8")
    return load(path, "patched_nanogpt")


@pytest.fixture(scope="module")
def nanogpt():
    return load(NANOGPT, "nanogpt_unchanged")


SIZE = dict(block_size=16, vocab_size=48, n_layer=3, n_head=2, n_embd=32)


def test_the_readme_diff_applied_to_nanogpt_is_the_example_line_for_line():
    """The README shows the shipped ``examples/nanogpt/autoln.diff`` as it is, and that file applied
    to nanoGPT's model.py is ``examples/gpt.py``."""
    assert readme_diff() == DIFF.read_text(encoding="utf-8")
    assert apply_unified_diff(NANOGPT.read_text(encoding="utf-8"), DIFF.read_text(encoding="utf-8")) == EXAMPLE.read_text(encoding="utf-8")
    assert "Copyright (c) 2022 Andrej Karpathy" in (NANOGPT.parent / "LICENSE").read_text(encoding="utf-8")


@pytest.mark.skipif(shutil.which("patch") is None, reason="no patch program on this machine (GNU patch applies the diff as the README says)")
def test_the_readme_s_patch_command_applies_the_shipped_diff(tmp_path):
    """``patch model.py < examples/nanogpt/autoln.diff``, as the README says, on a copy of nanoGPT's file."""
    import subprocess

    target = tmp_path / "model.py"
    shutil.copy(NANOGPT, target)
    with open(DIFF, "rb") as diff:
        proc = subprocess.run(["patch", "model.py"], stdin=diff, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert target.read_text(encoding="utf-8") == EXAMPLE.read_text(encoding="utf-8")
    assert "patch model.py < examples/nanogpt/autoln.diff" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_a_broken_diff_is_refused_by_the_applier():
    """The applier is strict: a context line that is not in the file fails (so the test above can fail)."""
    with pytest.raises(AssertionError, match="diff expects"):
        apply_unified_diff("a\nb\n", "@@ -1,2 +1,2 @@\n a\n-c\n+d\n")


def _train_losses(module, seed: int, steps: int = 3, attention=None, **cfg) -> tuple[list[float], int]:
    """Three (``steps``) AdamW steps of nanoGPT's own optimizer groups on random tokens: the losses
    and the parameter count. ``attention(block.attn)``, when given, replaces each block's attention
    (a hand-written variant) before the optimizer is built."""
    torch.manual_seed(seed)
    model = module.GPT(module.GPTConfig(**SIZE, **cfg))
    if attention is not None:
        for block in model.transformer.h:
            block.attn = attention(block.attn)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, SIZE["vocab_size"], (4, SIZE["block_size"]), generator=g)
        _, loss = model(x, torch.roll(x, -1, 1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses, sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("bias", [True, False])
def test_with_one_candidate_the_changed_model_is_nanogpt_loss_for_loss(patched, nanogpt, bias):
    """``("pre",)`` keeps nanoGPT's block: same parameter count (a bias-free nanoGPT stays bias-free)
    and the same losses, bit for bit, over three AdamW steps with nanoGPT's own optimizer groups."""
    got, n_got = _train_losses(patched, 0, bias=bias, norm_candidates=("pre",))
    want, n_want = _train_losses(nanogpt, 0, bias=bias)
    assert n_got == n_want and got == want
    torch.manual_seed(0)
    names = [n for n, _ in patched.GPT(patched.GPTConfig(**SIZE, bias=bias)).named_parameters() if n.endswith(".bias")]
    assert (len(names) > 0) == bias  # nanoGPT's bias=False: no bias anywhere, the sites' norms included


def test_the_changed_model_searches_and_derives(patched):
    torch.manual_seed(0)
    model = patched.GPT(patched.GPTConfig(**SIZE, bias=False, norm_candidates=("pre", "post", "deepnorm")))
    g = torch.Generator().manual_seed(1)
    data = [(x, torch.roll(x, -1, 1)) for x in (torch.randint(0, 48, (4, 16), generator=g) for _ in range(8))]
    cfg = autoln.SearchConfig(steps=6, warmup_steps=1, arch_warmup_steps=2, eval_every=3, eval_windows=4, selection_windows=4)
    outcome = autoln.search(model, data, steps=6, cfg=cfg, progress=False)
    assert list(outcome.genotype.sites) == [f"transformer.h.{i}.{s}_site" for i in range(3) for s in ("attn", "mlp")]
    fresh = patched.GPT(patched.GPTConfig(**SIZE, bias=False, norm_candidates=("pre", "post", "deepnorm")))
    autoln.derive(fresh, outcome.genotype)
    _, loss = fresh(*data[0])
    assert torch.isfinite(loss)


@pytest.mark.parametrize("layer, why", [
    (0, "got 0 (block i of enumerate is layer=i + 1)"), (-1, "got -1"), (4, "got 4"), (1.5, "got 1.5"), (True, "got True")])
def test_site_refuses_a_layer_outside_one_to_n_in_one_line_naming_it(layer, why):
    with pytest.raises(ValueError) as e:
        autoln.Site(["pre", "lns"], 8, 3, layer=layer)
    msg = str(e.value)
    assert msg == f"autoln.Site: layer: expected the 1-based block index, 1..n_layers=3, {why}" and "\n" not in msg


@pytest.mark.parametrize("kwargs, want", [
    (dict(candidates=[]), "autoln.Site: candidates: expected a list of placement names"),
    (dict(candidates="pre"), "autoln.Site: candidates: expected a list of placement names"),
    (dict(d_model=0), "autoln.Site: d_model: expected a positive integer, got 0"),
    (dict(n_layers=0, layer=1), "autoln.Site: n_layers: expected a positive integer, got 0"),
])
def test_site_refuses_other_arguments_that_would_fail_later(kwargs, want):
    args = dict(candidates=["pre", "post"], d_model=8, n_layers=3, layer=1) | kwargs
    with pytest.raises(ValueError, match=re.escape(want)):
        autoln.Site(args.pop("candidates"), args.pop("d_model"), args.pop("n_layers"), **args)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm", "dyt"])
def test_a_bias_free_site_has_no_norm_bias_and_mixes_as_before(norm):
    torch.manual_seed(0)
    names = ["pre", "post", "deepnorm", "peri", "outnorm", "lns", "none"]
    free, full = autoln.Site(names, 8, 3, norm, 2, bias=False), autoln.Site(names, 8, 3, norm, 2)
    assert not any(n.endswith("bias") for n, _ in free.named_parameters())
    with torch.no_grad():
        for n, p in free.named_parameters():
            p.copy_(dict(full.named_parameters())[n] + 0.1 * torch.randn_like(p))
    x, w = torch.randn(2, 5, 8), torch.softmax(torch.randn(7), 0)
    branch = nn.Linear(8, 8)
    want = sum(w[k] * p.output(x, branch(p.branch_input(x))) for k, p in enumerate(free.placements.values()))
    torch.testing.assert_close(free(x, branch, w), want, rtol=1e-5, atol=1e-6)


def test_deepnorm_weights_of_nanogpt_are_the_value_third_and_the_projections(patched):
    torch.manual_seed(0)
    fresh = patched.GPT(patched.GPTConfig(**SIZE, norm_candidates=("pre", "post", "deepnorm")))
    torch.manual_seed(0)
    plain = patched.GPT(patched.GPTConfig(**SIZE, norm_candidates=("pre", "post", "deepnorm")))
    sites = [f"transformer.h.{i}.{s}_site" for i in range(3) for s in ("attn", "mlp")]
    g = autoln.SiteGenotype(["pre", "post", "deepnorm"], {s: "deepnorm" for s in sites}, {s: [0, 0, 1.0] for s in sites})
    autoln.derive(fresh, g)  # the weights found by autoln.deepnorm_weights
    _, b = deepnorm_constants(3)
    d = SIZE["n_embd"]
    for f, p in zip(fresh.transformer.h, plain.transformer.h):
        torch.testing.assert_close(f.attn.c_attn.weight[2 * d:], b * p.attn.c_attn.weight[2 * d:])
        assert torch.equal(f.attn.c_attn.weight[:2 * d], p.attn.c_attn.weight[:2 * d])  # query and key untouched
        for a, c in ((f.attn.c_proj, p.attn.c_proj), (f.mlp.c_fc, p.mlp.c_fc), (f.mlp.c_proj, p.mlp.c_proj)):
            torch.testing.assert_close(a.weight, b * c.weight)
        assert torch.equal(f.attn.c_attn.bias, p.attn.c_attn.bias)  # biases are not DeepNorm's init
    shapes = [tuple(w.shape) for w in autoln.deepnorm_weights(plain, "transformer.h.0.attn_site")]
    assert shapes == [(d, d), (d, d)]
    assert [tuple(w.shape) for w in autoln.deepnorm_weights(plain, "transformer.h.0.mlp_site")] == [(4 * d, d), (d, 4 * d)]


class LlamaAttention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))


class TorchAttention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.mha = nn.MultiheadAttention(d, 2)


class Wide(nn.Module):
    """An MLP three times wide whose first layer is (3d, d) but no fused qkv: taken whole."""

    def __init__(self, d):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 3 * d), nn.Linear(3 * d, d)


class OtherBlock(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.attn_site, self.attn = autoln.Site(["pre", "deepnorm"], d, 2, layer=1), LlamaAttention(d)
        self.mha_site, self.mha = autoln.Site(["pre", "deepnorm"], d, 2, layer=1), TorchAttention(d)
        self.ffn_site, self.ffn = autoln.Site(["pre", "deepnorm"], d, 2, layer=1), Wide(d)
        self.ln_x = autoln.Site(["pre", "deepnorm"], d, 2, layer=2)


def test_deepnorm_weights_follow_the_rule_in_other_blocks():
    block = OtherBlock()
    a = block.attn
    assert [w.data_ptr() for w in autoln.deepnorm_weights(block, "attn_site")] == [a.wv.weight.data_ptr(), a.wo.weight.data_ptr()]
    m = block.mha.mha
    got = autoln.deepnorm_weights(block, "mha_site")
    assert torch.equal(got[0], m.in_proj_weight[16:]) and got[1] is m.out_proj.weight and len(got) == 2
    assert [w is v for w, v in zip(autoln.deepnorm_weights(block, "ffn_site"), (block.ffn.fc1.weight, block.ffn.fc2.weight))] == [True, True]
    with pytest.raises(ValueError, match=r"cannot find the branch of site 'ln_x'.*deepnorm_weights=lambda site"):
        autoln.deepnorm_weights(block, "ln_x")
    g = autoln.SiteGenotype(["pre", "deepnorm"], {n: "deepnorm" for n in ("attn_site", "mha_site", "ffn_site", "ln_x")},
                            {n: [0, 1.0] for n in ("attn_site", "mha_site", "ffn_site", "ln_x")})
    before = block.attn.wv.weight.clone()
    with pytest.raises(ValueError, match="ln_x"):
        autoln.derive(block, g)
    assert torch.equal(block.attn.wv.weight, before) and len(block.attn_site.placements) == 2  # refused before any change
