import math

import pytest
import torch
import torch.nn.functional as F

from autoln.space.placements import NORMS, PLACEMENTS, build_placement, deepnorm_constants, parse_name, scaled_norm


@pytest.mark.parametrize("n, a, b", [(6, 1.861, 0.380), (12, 2.213, 0.320)])
def test_deepnorm_constants_match_design_table(n, a, b):
    # docs/design.md's worked values are rounded; N=12's b prints as 0.320 there but is 96^(-1/4) = 0.31947
    got_a, got_b = deepnorm_constants(n)
    assert got_a == pytest.approx(a, abs=6e-4) and got_b == pytest.approx(b, abs=6e-4)
    assert got_a == pytest.approx((2 * n) ** 0.25, rel=1e-12)
    assert got_b == pytest.approx((8 * n) ** -0.25, rel=1e-12)


def test_deepnorm_encoder_decoder_rows():
    # DeepNet Table 1 with N = M = 6: encoder 0.81 (N^4 M)^(1/16), 0.87 (N^4 M)^(-1/16); decoder (3M)^(1/4), (12M)^(-1/4)
    a, b = deepnorm_constants(6, "enc-dec-encoder", 6)
    assert a == pytest.approx(0.81 * 6 ** (5 / 16)) and b == pytest.approx(0.87 * 6 ** (-5 / 16))
    assert round(a, 3) == 1.418 and round(b, 3) == 0.497
    a, b = deepnorm_constants(6, "enc-dec-decoder", 6)
    assert round(a, 3) == 2.060 and round(b, 3) == 0.343
    assert deepnorm_constants(6, "encoder") == deepnorm_constants(6, "decoder")
    with pytest.raises(ValueError, match="n_decoder_layers"):
        deepnorm_constants(6, "enc-dec-decoder")
    with pytest.raises(ValueError, match="positive"):
        deepnorm_constants(0)


def _ln(x):
    return F.layer_norm(x, x.shape[-1:])


@pytest.mark.parametrize("name", ["pre", "post", "deepnorm", "peri", "outnorm", "lns", "none"])
def test_placement_formulas(name):
    torch.manual_seed(1)
    x = torch.randn(2, 5, 8)
    branch = torch.nn.Linear(8, 8)
    p = PLACEMENTS[name](8, 6, "layernorm", layer=4)  # fresh norms: unit gain, zero bias; block l = 4
    a = (2 * 6) ** 0.25
    expected = {
        "pre": x + branch(_ln(x)),
        "post": _ln(x + branch(x)),
        "deepnorm": _ln(a * x + branch(x)),
        "peri": x + _ln(branch(_ln(x))),
        "outnorm": x + _ln(branch(x)),
        "lns": x + branch(_ln(x) / 2.0),  # 1 / sqrt(4)
        "none": x + branch(x),
    }[name]
    torch.testing.assert_close(p(x, branch), expected, rtol=0, atol=1e-6)


def test_norm_types_on_hand_checkable_input():
    x = torch.tensor([[1.0, -1.0, 3.0, -3.0]])  # mean 0, variance 5, mean square 5
    torch.testing.assert_close(NORMS["layernorm"](4)(x), x / math.sqrt(5 + 1e-5))
    rms = NORMS["rmsnorm"](4)
    torch.testing.assert_close(rms(x), x / math.sqrt(5 + torch.finfo(torch.float32).eps))
    dyt = NORMS["dyt"](4)  # Zhu et al. 2025: g * tanh(c x) + b, c = 0.5 at init, g = 1, b = 0
    assert dyt.alpha.item() == 0.5 and torch.equal(dyt.weight, torch.ones(4)) and torch.equal(dyt.bias, torch.zeros(4))
    with torch.no_grad():
        dyt.weight.fill_(2.0)
        dyt.bias.fill_(0.25)
    torch.testing.assert_close(dyt(x), 2.0 * torch.tanh(0.5 * x) + 0.25)
    for name in NORMS:  # fixed gains: no elementwise parameters (DyT keeps its scalar c)
        fixed = NORMS[name](4, affine=False)
        assert [n for n, _ in fixed.named_parameters()] == (["alpha"] if name == "dyt" else [])
        # scaled_norm(norm, z, w) = w * norm(z), with and without gains
        for norm in (fixed, NORMS[name](4)):
            for q in norm.parameters():
                q.data.add_(0.3)
            w = torch.tensor(0.7)
            torch.testing.assert_close(scaled_norm(norm, x, w), w * norm(x))


def test_candidate_names_and_fixed_forms():
    assert parse_name("pre") == ("pre", True) and parse_name("peri:fixed") == ("peri", False)
    for bad in ("none:fixed", "sandwich", "pre:frozen"):
        with pytest.raises(KeyError):
            parse_name(bad)
    assert build_placement("post:fixed", 8, 6, "layernorm").norm.weight is None
    assert build_placement("post", 8, 6, "layernorm").norm.weight.requires_grad


def test_deepnorm_scales_the_residual_not_the_branch():
    x = torch.ones(1, 1, 4) * torch.tensor([1.0, 2.0, 3.0, 4.0])
    zero = lambda t: torch.zeros_like(t)  # noqa: E731
    p = PLACEMENTS["deepnorm"](4, 2, "layernorm")
    # with F = 0 the output is LN(a x) = LN(x): scale-invariant, so check with F = x instead
    ident = lambda t: t  # noqa: E731
    a = 4 ** 0.25
    torch.testing.assert_close(p(x, ident), _ln((a + 1) * x))
    torch.testing.assert_close(p(x, zero), _ln(x))
    assert p.init_gain() == pytest.approx(16 ** -0.25)
    assert PLACEMENTS["pre"](4, 2, "layernorm").init_gain() == 1.0
    assert PLACEMENTS["post"](4, 2, "layernorm").init_gain() == 1.0
    assert math.isclose(p.alpha, a)


def test_raw_input_flags_give_two_branch_inputs():
    assert [PLACEMENTS[n].input for n in ("pre", "post", "deepnorm")] == ["norm", "raw", "raw"]
