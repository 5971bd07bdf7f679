"""Bilevel optimisation: exact second order, mixing functions, warm-up, regularisers, monitor."""

import numpy as np
import pytest
import torch
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from autoln.oneshot.architect import Architect, weight_step
from autoln.config import ModelConfig, SearchConfig
from autoln.space.mixing import MIXINGS, beta_regulariser, draw_gumbel, linear, site_entropy, zero_one_loss
from autoln.oneshot.monitor import DELTA, LAG, RATIO, START_FRACTION, WINDOW, CollapseMonitor, alpha_hessian, max_eigenvalue
from autoln.models.supernet import Supernet
from autoln.engine.training import weight_optimizer

from .conftest import ROOT

VOCAB = 11


def _tiny(dtype=torch.float64):
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=8, n_heads=2, d_ff=16, context=6)
    net = Supernet(cfg, VOCAB, arch_init_std=0.5).to(dtype)
    return net


def _batch(n=4, t=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (n, t), generator=g)
    return x, torch.roll(x, -1, 1)


def _exact_unrolled_gradient(net, batch_w, batch_a, xi):
    """d/d alpha of L_alpha(w - xi grad_w L_w(w, alpha), alpha), by autograd through the step."""
    names = [n for n, _ in net.named_weight_parameters()]
    w = {n: p.detach().clone().requires_grad_() for n, p in net.named_weight_parameters()}
    a = net.alphas.detach().clone().requires_grad_()
    with sdpa_kernel(SDPBackend.MATH):
        loss_w = functional_call(net, {**w, "alphas": a}, batch_w)[1]
        grads = torch.autograd.grad(loss_w, [w[n] for n in names], create_graph=True)
        w1 = {n: w[n] - xi * g for n, g in zip(names, grads)}
        loss_a = functional_call(net, {**w1, "alphas": a}, batch_a)[1]
        (g_alpha,) = torch.autograd.grad(loss_a, [a])
    return g_alpha


def test_second_order_gradient_matches_autograd_through_the_step():
    net = _tiny()
    cfg = SearchConfig(order=2)
    arch = Architect(net, cfg)
    batch_w, batch_a = _batch(seed=1), _batch(seed=2)
    xi = 0.5
    _, (g2,) = arch.gradient(batch_w, batch_a, xi, step=1)
    exact = _exact_unrolled_gradient(net, batch_w, batch_a, xi)
    cos = torch.nn.functional.cosine_similarity(g2.flatten(), exact.flatten(), dim=0).item()
    rel = ((g2 - exact).norm() / exact.norm()).item()
    assert cos >= 0.99 and rel <= 0.05, (cos, rel)
    # and the second-order term matters here: the first-order gradient is far off
    _, (g1,) = Architect(net, SearchConfig(order=1)).gradient(batch_w, batch_a, xi, step=1)
    assert ((g1 - exact).norm() / exact.norm()).item() > 0.2


def test_second_order_with_dropout_matches_the_exact_hypergradient_under_fixed_masks():
    # the virtual step and the w+/w- passes replay one dropout mask, so the finite difference
    # approximates d/d alpha L_alpha(w - xi grad_w L_w(w, alpha)) with L_w under that mask
    torch.manual_seed(0)
    net = Supernet(ModelConfig(n_layers=2, d_model=8, n_heads=2, d_ff=16, context=6, dropout=0.1), VOCAB,
                   arch_init_std=0.5).double()
    batch_w, batch_a = _batch(seed=1), _batch(seed=2)
    xi = 0.5
    grads, exacts = [], []
    for seed in (7, 8):
        torch.manual_seed(seed)
        grads.append(Architect(net, SearchConfig(order=2)).gradient(batch_w, batch_a, xi, step=1)[1][0])
        after = torch.get_rng_state()
        torch.manual_seed(seed)
        exacts.append(_exact_unrolled_gradient(net, batch_w, batch_a, xi))
        assert torch.equal(after, torch.get_rng_state())  # the replays left the generator after L_alpha's pass
    for g2, exact in zip(grads, exacts):  # (drawing masks per pass instead: cosine 0.13 and 0.18)
        cos = torch.nn.functional.cosine_similarity(g2.flatten(), exact.flatten(), dim=0).item()
        # what is left is the central difference's own truncation error (2 % here without dropout)
        assert cos >= 0.99 and ((g2 - exact).norm() / exact.norm()).item() <= 0.1, cos
    # the masks matter: two random states give two different exact gradients
    assert ((exacts[0] - exacts[1]).norm() / exacts[0].norm()).item() > 0.05


def test_finite_difference_uses_parenthesised_two_eps():
    # the known public bug divides by 2 and multiplies by eps; a linear-in-eps check catches it
    net = _tiny()
    arch = Architect(net, SearchConfig(order=2))
    batch_w = _batch(seed=1)
    backup = [p.detach().clone() for p in net.weight_parameters()]
    v = [torch.randn_like(p) for p in backup]
    (hvp,) = arch.hessian_vector_product(backup, v, batch_w)
    arch.restore(backup)
    # exact mixed second derivative by double backward: grad_alpha (grad_w L_w . v)
    with sdpa_kernel(SDPBackend.MATH):
        weights = net.weight_parameters()
        gw = torch.autograd.grad(net(*batch_w)[1], weights, create_graph=True)
        dot = sum((g * d).sum() for g, d in zip(gw, v))
        (ref,) = torch.autograd.grad(dot, [net.alphas])
    torch.testing.assert_close(hvp, ref, rtol=2e-2, atol=1e-4 * ref.abs().max().item())


def test_virtual_step_changes_weights_and_everything_is_restored_bitwise():
    net = _tiny()
    cfg = SearchConfig(order=2, lr=0.1, warmup_steps=0)
    opt, sched = weight_optimizer(net.named_weight_parameters(), cfg)
    arch = Architect(net, cfg)
    batch_w, batch_a = _batch(seed=1), _batch(seed=2)
    weight_step(net, opt, sched, *batch_w, grad_clip=1.0)  # give the optimizer some state
    before = {k: v.clone() for k, v in net.state_dict().items()}
    opt_before = {i: {k: v.clone() for k, v in s.items()} for i, s in enumerate(opt.state.values())}

    grads = torch.autograd.grad(net(*batch_w)[1], net.weight_parameters())
    backup = arch.virtual_step(batch_w, xi=0.1)
    for (name, p), g, b in zip(net.named_weight_parameters(), grads, backup):
        assert torch.equal(b, before[name])
        torch.testing.assert_close(p.detach(), b - 0.1 * g)
    assert any(not torch.equal(p.detach(), b) for p, b in zip(net.weight_parameters(), backup))
    arch.restore(backup)

    arch.step(batch_w, batch_a, xi=0.1, step=1)
    after = net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if k != "alphas")
    assert not torch.equal(before["alphas"], after["alphas"])
    for i, s in enumerate(opt.state.values()):
        assert all(torch.equal(opt_before[i][k], v) for k, v in s.items())


def test_gumbel_hard_is_one_hot_forward_and_soft_backward():
    torch.manual_seed(3)
    alphas = torch.randn(5, 3, requires_grad=True)
    w = MIXINGS["gumbel-hard"](alphas, 0.7, draw_gumbel(alphas))
    assert torch.equal(w.detach().sum(-1), torch.ones(5))
    assert set(w.detach().flatten().tolist()) == {0.0, 1.0}
    (w * torch.arange(3.0)).sum().backward()
    assert alphas.grad is not None and alphas.grad.abs().sum() > 0
    # without noise: the relaxed softmax(alpha / tau)
    torch.testing.assert_close(MIXINGS["gumbel-hard"](alphas, 0.7, None), torch.softmax(alphas / 0.7, -1))
    # the search model draws noise only in training steps of stochastic mixings
    net = Supernet(ModelConfig(n_layers=1, d_model=8, n_heads=2, d_ff=8, context=4), VOCAB, mixing="gumbel-hard")
    assert net.draw_gumbel() is not None and net.eval().draw_gumbel() is None


def test_gumbel_soft_with_noise():
    alphas = torch.tensor([[0.0, 1.0, 2.0]])
    g = torch.tensor([[0.5, -0.5, 0.0]])
    torch.testing.assert_close(MIXINGS["gumbel"](alphas, 2.0, g), torch.softmax((alphas + g) / 2.0, -1))


def test_temperature_schedule():
    assert linear(5.0, 0.5, 0, 100) == 5.0
    assert linear(5.0, 0.5, 50, 100) == pytest.approx(2.75)
    assert linear(5.0, 0.5, 100, 100) == 0.5
    assert linear(5.0, 0.5, 150, 100) == 0.5


def test_search_schedules_end_on_their_final_values():
    # tau 2 -> 0.5 over 100 steps: the last step uses tau_end exactly (it ended at 0.515)
    from autoln.oneshot.run_search import sdarts_noise, temperature

    sc = SearchConfig(steps=100, tau_start=2.0, tau_end=0.5, sdarts_eps=0.3)
    assert (temperature(sc, 1), temperature(sc, 100)) == (2.0, 0.5)
    # SDARTS-RS (reference code): eps from 0.03 up to eps_max; a smaller eps_max stays constant
    assert sdarts_noise(sc, 1) == pytest.approx(0.03) and sdarts_noise(sc, 100) == pytest.approx(0.3)
    assert sdarts_noise(sc, 34) == pytest.approx(0.03 + 0.27 / 3)
    assert sdarts_noise(SearchConfig(steps=10, sdarts_eps=0.01), 1) == sdarts_noise(SearchConfig(steps=10, sdarts_eps=0.01), 10) == 0.01
    assert sdarts_noise(SearchConfig(steps=10), 5) == 0.0


def test_zero_one_loss_values():
    # sigmoid(0) = 0.5 -> 0; sigmoid(-inf) = 0 and sigmoid(+inf) = 1 -> -0.25
    assert zero_one_loss(torch.zeros(3, 3)).item() == 0.0
    assert zero_one_loss(torch.full((2, 3), -1e4)).item() == pytest.approx(-0.25)
    assert zero_one_loss(torch.full((2, 3), 1e4)).item() == pytest.approx(-0.25)
    a = torch.tensor([[0.0, 1e4], [-1e4, 0.0]])
    assert zero_one_loss(a).item() == pytest.approx(-0.125)


def test_beta_regulariser_and_entropy_values():
    a = torch.zeros(4, 3)
    assert beta_regulariser(a).item() == pytest.approx(np.log(3))
    assert site_entropy(torch.full((2, 4), 0.25)).tolist() == pytest.approx([np.log(4)] * 2)
    assert site_entropy(torch.tensor([[1.0, 0.0, 0.0]])).item() == pytest.approx(0.0, abs=1e-12)


def test_sigmoid_mixing_weights_and_probabilities():
    net = Supernet(ModelConfig(n_layers=1, d_model=8, n_heads=2, d_ff=8, context=4), VOCAB, mixing="sigmoid")
    with torch.no_grad():
        net.alphas.copy_(torch.tensor([[0.0, 2.0, -2.0]]))
    s = torch.sigmoid(torch.tensor([0.0, 2.0, -2.0]))
    torch.testing.assert_close(net.site_weights()[0].detach(), s)
    assert net.probabilities()[0] == pytest.approx((s / s.sum()).double().numpy())


def test_arch_warmup_keeps_alphas_then_moves_them(tmp_path):
    from autoln.config import load_config
    from autoln.oneshot.run_search import run_search

    cfg = load_config(None, ["model.n_layers=1", "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.context=16",
                             f"data.corpus={_corpus(tmp_path)}", f"data.cache_dir={tmp_path / 'c'}", "search.steps=6",
                             "search.eval_every=3", "search.arch_warmup_steps=3", "search.batch_size=2", "search.eval_windows=2",
                             "search.arch_lr=0.1", "search.monitor_windows=2", "logging.progress=false", "logging.tensorboard=false"])
    run_search(cfg, tmp_path / "run")
    ckpts = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    torch.manual_seed(cfg.search.seed)
    init = Supernet(cfg.model, 256, cfg.search.arch_init_std).alphas.detach()
    # the checkpoint at step 6 has moved alphas; re-run to step 3 only to see them untouched
    assert not torch.allclose(ckpts["model"]["alphas"], init)
    cfg.search.steps = 3
    run_search(cfg, tmp_path / "run3")
    at3 = torch.load(tmp_path / "run3" / "checkpoint.pt", weights_only=False)["model"]["alphas"]
    assert torch.equal(at3, init)
    # arch_lr 0: DARTS-PT's fixed-alpha supernet, the alphas never leave their start (and the
    # perturbation selection's fine-tuning takes no alpha step either)
    cfg.search.steps, cfg.search.arch_lr, cfg.search.selection_tune_steps = 6, 0.0, 2
    run_search(cfg, tmp_path / "fixed")
    assert torch.equal(torch.load(tmp_path / "fixed" / "checkpoint.pt", weights_only=False)["model"]["alphas"], init)


def _corpus(tmp_path):
    f = tmp_path / "text.txt"
    f.write_text("".join(f"the quick brown fox {i % 7} jumps over the lazy dog {i % 5}\n" for i in range(400)))
    return f


def test_hessian_eigenvalue_matches_finite_difference():
    net = _tiny()
    x, y = _batch(seed=4)
    lam = max_eigenvalue(alpha_hessian(net, x, y))
    a0 = net.alphas.detach().clone()
    n, h = a0.numel(), 1e-4

    def grad_at(a):
        with torch.no_grad():
            net.alphas.copy_(a)
        net.eval()
        (g,) = torch.autograd.grad(net(x, y)[1], [net.alphas])
        return g.flatten()

    fd = np.zeros((n, n))
    for i in range(n):
        e = torch.zeros(n, dtype=a0.dtype)
        e[i] = h
        fd[i] = ((grad_at(a0 + e.view_as(a0)) - grad_at(a0 - e.view_as(a0))) / (2 * h)).numpy()
    with torch.no_grad():
        net.alphas.copy_(a0)
    ref = np.linalg.eigvalsh(0.5 * (fd + fd.T))[-1]
    assert lam == pytest.approx(ref, rel=0.01)
    assert abs(ref) > 1e-6


def _feed(m, values, every=10):
    """Append eigenvalues as :meth:`CollapseMonitor.update` would, one evaluation per ``every`` steps."""
    for v in values:
        m.eigenvalues.append(v)
        m.smoothed.append(float(np.mean(m.eigenvalues[-WINDOW:])))
        m.steps.append(every * len(m.eigenvalues))


def test_r_darts_rule_as_the_reference_code():
    # automl/RobustDARTS EVLocalAvg.early_stop: local averages over 5 evaluations, compared 2 apart, factor 1.3
    assert (RATIO, WINDOW, DELTA, LAG, START_FRACTION) == (1.3, 5, 2, 4, 0.4)
    m = CollapseMonitor()
    _feed(m, [1.0] * 6 + [5.0])  # averages: ..., 1.0 (two back), 1.8 now
    assert m.should_stop()
    m = CollapseMonitor()
    _feed(m, [1.0] * 6)
    assert not m.should_stop()  # 6 < WINDOW + DELTA evaluations
    _feed(m, [2.4])
    assert not m.should_stop()  # (4 + 2.4) / 5 = 1.28 <= 1.3 x 1.0
    m = CollapseMonitor()
    _feed(m, [1.0] * 6 + [2.6])
    assert m.should_stop()  # 1.32 > 1.3
    # the stop returns evaluation t - 4 (step 30 here); not before 40 % of the search (reference: 20 of 50 epochs)
    m = CollapseMonitor(total_steps=100)
    _feed(m, [1.0] * 6 + [2.6])
    assert not m.should_stop()  # step 30 < 40
    m.total_steps = 75
    assert m.should_stop()  # step 30 >= 30


def test_r_darts_early_stop_exports_the_genotype_from_before_the_rise(tmp_path, monkeypatch, cache_dir):
    # eigenvalues forced to 1 x7 then 10: the rule fires at the 8th evaluation (step 16) and R-DARTS
    # returns the architecture 4 evaluations earlier (step 8), here "deepnorm pre"; by the stop the
    # alphas say "pre pre"
    from autoln.oneshot import monitor as mon
    from autoln.config import load_config
    from autoln.models.genotype import Genotype
    from autoln.oneshot.run_search import run_search, temperature

    eigen = iter([1.0] * 7 + [10.0] * 5)
    monkeypatch.setattr(mon, "alpha_hessian", lambda model, x, y: torch.zeros(1, 1))
    monkeypatch.setattr(mon, "max_eigenvalue", lambda h: next(eigen))
    update = CollapseMonitor.update

    def forced(self, model, batch=None, step=0):
        with torch.no_grad():  # deepnorm pre up to step 8, pre pre after
            model.alphas.copy_(torch.tensor([[0.0, 0.0, 2.0], [2.0, 0.0, 0.0]] if step <= 8 else [[2.0, 0.0, 0.0]] * 2))
        return update(self, model, batch, step)

    monkeypatch.setattr(CollapseMonitor, "update", forced)
    cfg = load_config(str(ROOT / "configs" / "tiny.yaml"),
                      ["search.steps=20", "search.eval_every=2", "search.eval_windows=2", "search.arch_warmup_steps=0",
                       "search.early_stop=hessian", "search.monitor_windows=1", "search.selection=perturbation",
                       "logging.progress=false", "logging.tensorboard=false"])
    result = run_search(cfg, tmp_path / "run")
    g = Genotype.load(result.path)
    assert g.describe().startswith("deepnorm pre")
    assert g.provenance["metrics"]["early_stop"] == {"stopped_at_step": 16, "genotype_from_step": 8}
    assert g.provenance["selection"]["method"] == "argmax" and "before the eigenvalue rise" in g.provenance["selection"]["note"]
    expected = torch.softmax(torch.tensor([[0.0, 0.0, 2.0], [2.0, 0.0, 0.0]], dtype=torch.float64) / temperature(cfg.search, 8), -1)
    np.testing.assert_allclose(g.site_probabilities(), expected.numpy(), rtol=0, atol=1e-6)


def test_monitor_records_entropy_eigenvalue_and_genotype_change():
    net = _tiny()
    m = CollapseMonitor()
    with torch.no_grad():
        net.alphas.zero_()
        net.alphas[:, 0] = 1.0
    first = m.update(net, _batch(seed=4))
    assert first["genotype"] == [0] * net.alphas.shape[0] and not first["genotype_changed"]
    p = np.exp([1.0, 0.0, 0.0]) / np.exp([1.0, 0.0, 0.0]).sum()
    assert first["entropy"] == pytest.approx([-(p * np.log(p)).sum()] * net.alphas.shape[0])
    assert first["eigenvalue"] == pytest.approx(max_eigenvalue(alpha_hessian(net, *_batch(seed=4))))
    with torch.no_grad():
        net.alphas[0, 2] = 5.0
    second = m.update(net)
    assert second["genotype_changed"] and second["genotype"][0] == 2 and "eigenvalue" not in second
    assert len(m.eigenvalues) == 1 and len(m.genotypes) == 2


def test_sdarts_noise_is_uniform_within_eps_and_only_where_asked():
    torch.manual_seed(0)
    net = Supernet(ModelConfig(n_layers=3, d_model=8, n_heads=2, d_ff=8, context=4), VOCAB)
    clean = net.mixing_weights()
    noisy = net.mixing_weights(noise=0.03)
    diff = (noisy - clean).detach()
    assert diff.abs().max() <= 0.03 and diff.abs().max() > 0.01
    assert torch.equal(diff[:, 0], diff[:, 1])  # one draw per site, shared by its two sublayers
    assert torch.equal(net.mixing_weights(), clean)  # no noise unless asked (alpha steps, evaluation)
