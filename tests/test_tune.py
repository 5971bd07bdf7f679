"""The Optuna outer loop (``search.py --tune``): the exact cap's admission rule, trial outcomes,
``tune.space`` validation, and end to end through the command line: the report files, resuming,
a config mismatch, a diverged trial, two workers on a journal file and on PostgreSQL, and
workers killed with SIGKILL in the middle of a trial."""

from __future__ import annotations

import csv
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from autoln.config import load_config
from autoln.core.errors import ConfigError
from autoln.models.genotype import Genotype

from .conftest import ROOT

TINY = str(ROOT / "configs" / "tiny.yaml")
#: A trial of a second or two: 20 search steps, scored by the supernet, no pruning.
FAST = ("--set", "search.steps=20", "--set", "search.arch_warmup_steps=4", "--set", "search.eval_every=10", "--set", "search.eval_windows=4",
        "--set", "search.monitor_windows=0", "--set", "tune.score=supernet", "--set", "tune.pruner=none",
        "--set", "logging.tensorboard=false")
#: A trial of several seconds, long enough to be killed in the middle.
SLOW = ("--set", "search.steps=150", "--set", "search.eval_every=50", "--set", "search.eval_windows=4",
        "--set", "search.monitor_windows=0", "--set", "tune.score=supernet", "--set", "tune.pruner=none",
        "--set", "logging.tensorboard=false", "--set", "tune.space={search.arch_lr: {log-uniform: [1.0e-4, 1.0e-2]}}")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("tune-cache"))


def command(out: Path, *args: str) -> list[str]:
    return [sys.executable, str(ROOT / "search.py"), "--tune", "--config", TINY, "--out", str(out), *args,
            "--set", "logging.progress=false"]


def tune(out: Path, *args: str, cache: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(command(out, *args), capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "XDG_CACHE_HOME": cache})
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def start(out: Path, *args: str, cache: str, threads: int | None = None) -> subprocess.Popen:
    env = {**os.environ, "XDG_CACHE_HOME": cache}
    if threads:  # several commands side by side, as on several machines: one core each
        env["OMP_NUM_THREADS"] = str(threads)
    return subprocess.Popen(command(out, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=env, start_new_session=True)


def rows(out: Path) -> list[dict]:
    with open(out / "trials.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def finished(table: list[dict]) -> list[dict]:
    return [r for r in table if r["outcome"] in ("complete", "pruned", "diverged", "error")]


def load_study(storage, name: str = "autoln"):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    return optuna.load_study(study_name=name, storage=storage)


def journal(out: Path):
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    return JournalStorage(JournalFileBackend(str(out / "study.journal")))


def wait_for_running(storage_fn, min_number: int, timeout: float = 180.0):
    """Poll the study until a trial numbered >= ``min_number`` has run for about a second."""
    from optuna.trial import TrialState

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            trials = load_study(storage_fn()).get_trials(states=(TrialState.RUNNING,))
        except Exception:  # the study is not created yet
            trials = []
        for t in trials:
            if t.number >= min_number and t.user_attrs.get("worker") and t.datetime_start:
                time.sleep(1.5)
                return t
        time.sleep(0.3)
    raise AssertionError("no trial started in time")


# --- units ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("space, message", [
    ("{search.nope: {uniform: [0, 1]}}", "unknown key"),
    ("{tune.n_trials: {int: [1, 2]}}", "section one of"),
    ("{search.lr: {uniform: [1.0, 0.5]}}", "low (1.0) must be below high (0.5)"),
    ("{search.lr: {log-uniform: [0, 1]}}", "log-uniform needs low > 0"),
    ("{search.lr: {normal: [0, 1]}}", "exactly one of"),
    ("{search.lr: [0.1, 0.2]}", "must be a mapping"),
    ("{search.order: {categorical: [1, 3]}}", "the value 3 is invalid: search.order must be 1 or 2"),
    ("{search.order: {uniform: [1, 2]}}", "needs a number key"),
    ("{search.arch_warmup_steps: {int: [10, 100], step: 7}}", "step must be a positive integer dividing"),
    # a pruner compares trials at equal steps: a tuned search length is refused with one on
    ("{search.steps: {int: [100, 500], step: 100}}", "a tuned search length cannot be pruned fairly"),
    ("{search.lr: {uniform: [-1.0, 1.0]}}", "search.lr must be > 0"),
    ("{search.mixing: {categorical: [softmax, [1]]}}", "choices must be numbers, strings"),
    ("{}", "tune.space must name at least one key"),
    ("{data.tokenizer: {categorical: [bytes, chars]}}", "data.tokenizer cannot be tuned"),
    ("{retrain.steps: {int: [10, 20]}}", "retrain.steps cannot be tuned"),
    ("{search.lr: {uniform: [0.001, 0.01], step: 2}}", "step must be a positive number that divides high - low"),
    # a bound at which the alphas never move (warm-up >= the 500 search steps)
    ("{search.arch_warmup_steps: {int: [0, 500], step: 100}}",
     "tune.space['search.arch_warmup_steps']: the value 500 is invalid: search.arch_warmup_steps (500) must be below search.steps (500)"),
    # each bound is fine alone; together the short search and the long warm-up are not
    ("{search.steps: {int: [150, 500], step: 50}, search.arch_warmup_steps: {int: [0, 200], step: 50}}",
     "tune.space: a trial could draw search.steps=150, search.arch_warmup_steps=200, which is invalid: search.arch_warmup_steps (200) must be below search.steps (150)"),
])
def test_space_errors_name_the_key(space, message):
    pruner = ["tune.pruner=none"] if "search.arch_warmup_steps (200)" in message else []  # tunes search.steps
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"tune.space={space}", *pruner]).validate_space()
    assert message in str(err.value)


def test_space_bounds_are_checked_only_when_tuning():
    cfg = load_config(None, ["search.mixing=sigmoid", "search.tau_end=1.0"])  # a plain search: the default space's tau_start is irrelevant
    with pytest.raises(ConfigError, match=r"tune.space\['search.tau_start'\]: the value 0.5 is invalid"):
        cfg.validate_space()


def test_space_and_storage_accepted_and_refused():
    cfg = load_config(TINY, ["tune.space={search.order: {categorical: [1, 2]}, search.lr: {log-uniform: [1.0e-4, 1.0e-2]}}"])
    assert cfg.tune.space["search.order"] == {"categorical": [1, 2]}
    with pytest.raises(ConfigError, match="tune.storage must be null .* or an RDB URL"):
        load_config(None, ["tune.storage=/tmp/x.db"])
    with pytest.raises(ConfigError, match="tune.grace_period"):
        load_config(None, ["tune.heartbeat_interval=10", "tune.grace_period=5"])


def test_admission_rule_gives_an_exact_cap():
    """Trials are admitted in number order while fewer than ``cap`` earlier ones are finished,
    running or waiting; a lost (FAIL while running) trial frees its slot."""
    import optuna
    from optuna.trial import TrialState

    from autoln.tune import admitted, census, outcome

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study()
    t = [study.ask() for _ in range(4)]
    for trial in t:
        trial.set_user_attr("outcome", "running")
    assert [admitted(study, x.number, 2) for x in t] == [True, True, False, False]
    study.tell(t[0], 1.0)
    t[1].set_user_attr("outcome", "error")
    study.tell(t[1], state=TrialState.FAIL)  # failed by its own error: counts
    assert not admitted(study, 2, 2)
    study.tell(t[2], state=TrialState.FAIL)  # over-cap refusals / lost trials do not count
    assert census(study).finished == 2 and census(study).lost == 1
    study2 = optuna.create_study()
    a, b = study2.ask(), study2.ask()
    a.set_user_attr("outcome", "running")
    b.set_user_attr("outcome", "running")
    assert not admitted(study2, b.number, 1)
    study2.tell(a, state=TrialState.FAIL)  # a's worker died: b may run
    assert admitted(study2, b.number, 1)
    assert outcome(study2.trials[0]) == "lost"
    study2.enqueue_trial({})
    assert not admitted(study2, 3, 2)  # b running + a waiting re-run ahead of it


# --- end to end ----------------------------------------------------------------------------------


#: The tiny study at a shorter search and proxy retrain (the tuned arch_warmup_steps stay below 40).
STUDY = ("--set", "search.steps=40", "--set", "search.eval_every=20", "--set", "tune.proxy_steps=20")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, cache):
    out = tmp_path_factory.mktemp("tune") / "study"
    proc = tune(out, *STUDY, "--set", "tune.n_trials=4", cache=cache)  # four trials of the tiny study
    return out, proc


def test_tune_writes_best_genotype_table_plots_and_hparams(tuned):
    out, proc = tuned
    table = rows(out)
    assert [int(r["number"]) for r in table] == [0, 1, 2, 3]
    assert len(finished(table)) == 4
    best = Genotype.load(out / "best_genotype.json")
    done = [r for r in table if r["outcome"] == "complete"]
    winner = min(done, key=lambda r: float(r["score"]))
    assert best.provenance["tune"]["trial"] == int(winner["number"])
    assert abs(best.provenance["tune"]["score"] - float(winner["score"])) < 1e-4
    assert best.describe() == winner["genotype"]
    for r in done:  # the genotype of every finished search, and its proxy retrain
        assert Genotype.load(out / "genotypes" / f"{int(r['number']):04d}.json").describe() == r["genotype"]
        assert (out / "trials" / f"{int(r['number']):04d}" / "proxy" / "metrics.json").exists()
    for name in ("optimization_history", "param_importances", "intermediate_values"):
        assert (out / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "trials.md").read_text()
    assert "| number | state | outcome | score | genotype | search.arch_lr |" in md and f"Best: trial {winner['number']}" in md
    assert f"best: trial {winner['number']}" in proc.stdout

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "trials" / "0000"))
    acc.Reload()
    assert "hparams/score" in acc.Tags()["scalars"]
    plugin = acc.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in plugin and b"search.arch_lr" in plugin["_hparams_/session_start_info"]


def test_rerun_resumes_extends_and_refuses_another_config(tuned, cache):
    out, _ = tuned
    before = (out / "trials.csv").read_text()
    again = tune(out, *STUDY, "--set", "tune.n_trials=4", cache=cache)
    assert "4/4 finished" in again.stdout and (out / "trials.csv").read_text() == before
    more = tune(out, *STUDY, "--set", "tune.n_trials=5", cache=cache)
    table = rows(out)
    assert "5/5 finished" in more.stdout and len(finished(table)) == 5
    assert table[4]["search.arch_lr"] not in {r["search.arch_lr"] for r in table[:4]}  # the resumed sampler draws anew
    for script in ("search.py", "retrain.py"):  # a study folder is the study's own
        other = subprocess.run([sys.executable, str(ROOT / script), "--genotype", "all-pre", "--config", TINY, "--out", str(out)]
                               if script == "retrain.py" else [sys.executable, str(ROOT / script), "--config", TINY, "--out", str(out)],
                               capture_output=True, text=True, env={**os.environ, "XDG_CACHE_HOME": cache})
        assert other.returncode == 2 and "holds a tuning study" in other.stderr
    bad = tune(out, *STUDY, "--set", "tune.n_trials=5", "--set", "search.steps=50", cache=cache, check=False)
    assert bad.returncode == 2 and "search.steps (40 in the study, 50 now)" in bad.stderr
    assert "Traceback" not in bad.stderr and len(rows(out)) == 5


def test_the_proxy_reports_after_the_trial_s_own_search_and_a_stale_journal_lock_goes(tmp_path, cache):
    """A trial whose tuned search.steps (40) differs from the study config's (20) reports its
    search at steps 20 and 40 and its proxy retrain at 40 + 20 = 60: no step twice, so Optuna
    drops none of them (optuna/optuna#2441)."""
    import optuna

    from autoln.tune import open_study

    out = tmp_path / "steps"
    # and a stale Optuna journal lock (a symlink study.journal.lock) left by a killed command: this
    # command holds the folder's own lock, so it removes the stale one at once and says so, instead
    # of sitting silent while Optuna waits 30 s to force it (optuna/optuna#6361)
    out.mkdir()
    os.symlink(out / "study.journal", out / "study.journal.lock")
    sets = [*FAST[1::2], "tune.n_trials=1", "tune.score=proxy_retrain", "tune.proxy_steps=20", "retrain.eval_every=20",
            "retrain.final_eval_windows=16", "tune.space={search.steps: {categorical: [40]}}", "search.eval_every=20"]
    proc = tune(out, *(a for key in sets for a in ("--set", key)), cache=cache)
    assert "already reported" not in proc.stderr
    assert "journal lock left by a killed command" in proc.stderr and not os.path.lexists(out / "study.journal.lock")
    cfg = load_config(TINY, [*sets, "logging.progress=false"])
    trial = open_study(cfg, out, 0).get_trials(deepcopy=False, states=[optuna.trial.TrialState.COMPLETE])[0]
    assert sorted(trial.intermediate_values) == [20, 40, 60]
    assert trial.intermediate_values[60] == pytest.approx(trial.value)  # the final evaluation, on the same 16 windows


def test_diverged_trial_is_pruned_with_its_reason_and_the_study_completes(tmp_path, cache):
    out = tmp_path / "div"
    proc = tune(out, *FAST, "--set", "tune.n_trials=3", "--set", "tune.sampler=random",
                "--set", "tune.space={search.lr: {categorical: [1000.0, 0.002]}}", cache=cache)
    table = rows(out)
    assert len(finished(table)) == 3 and "3/3 finished" in proc.stdout
    diverged = [r for r in table if r["outcome"] == "diverged"]
    assert diverged and all(r["state"] == "PRUNED" and r["search.lr"] == "1000.0" for r in diverged)
    assert all("search diverged at step" in r["reason"] for r in diverged)
    assert all(r["search.lr"] == "0.002" for r in table if r["outcome"] == "complete")


def strict_json_files(folder: Path) -> list[Path]:
    """Every ``*.json`` under ``folder``, each parsed by a strict parser (no NaN, Infinity)."""
    import json

    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")

    paths = sorted(folder.rglob("*.json"))
    for path in paths:
        json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)
    return paths


def test_skipped_updates_are_on_the_trial_s_record_and_a_nan_report_is_strict_json(tmp_path, cache):
    import json

    out = tmp_path / "skip"
    proc = tune(out, *FAST, "--set", "tune.n_trials=1", "--set", "search.on_divergence=skip_batch",
                "--set", "tune.space={search.lr: {categorical: [1000.0]}}", cache=cache, check=False)
    trial = load_study(journal(out)).trials[0]
    assert trial.user_attrs["skipped_batches"]["search"] > 0
    assert "warning: updates skipped (NaN/inf loss or gradient, on_divergence=skip_batch): " in proc.stderr
    reports = out / "trials" / "0000" / "reports.json"
    assert None in json.loads(reports.read_text()).values()  # the NaN valid loss, as strict JSON's null
    assert reports in strict_json_files(out) and len(strict_json_files(out)) >= 3


def test_every_json_file_of_a_study_is_strict(tuned):
    out, _ = tuned
    names = {p.name for p in strict_json_files(out)}
    assert {"best_genotype.json", "reports.json", "genotype.json", "metrics.json"} <= names


def test_a_trial_that_raises_is_recorded_and_the_study_goes_on(tmp_path, cache):
    """A valid config that the data cannot serve (windows longer than the valid split): every
    trial fails with its reason. (A space whose values break a config rule is refused up front.)"""
    out = tmp_path / "errors"
    proc = tune(out, *FAST, "--set", "tune.n_trials=2", "--set", "tune.space={model.context: {categorical: [4000000]}}",
                cache=cache)
    table = rows(out)
    assert [r["outcome"] for r in table] == ["error", "error"] and all(r["state"] == "FAIL" for r in table)
    assert all("split has" in r["reason"] and "needs at least" in r["reason"] for r in table)
    assert "DataError" in (out / "trials" / "0000" / "error.txt").read_text()
    assert "2/2 finished" in proc.stdout and "no trial completed" in proc.stdout and not (out / "best_genotype.json").exists()


def test_resuming_checks_the_direction(tmp_path):
    import optuna

    from autoln.tune import open_study

    out = tmp_path / "s"
    out.mkdir()
    optuna.create_study(study_name="autoln", storage=journal(out), direction="maximize")
    with pytest.raises(ConfigError, match="not a single-objective minimisation study"):
        open_study(load_config(TINY), out, create=True)


def test_journal_two_workers_exact_cap_and_a_killed_worker(tmp_path, cache):
    """--workers 2 on the journal file: SIGKILL the worker running trial >= 1 in the middle of
    its search; the study still ends with exactly N finished trials, the killed one failed and
    re-run; re-running the command adds nothing."""
    out, n = tmp_path / "journal", 4
    proc = start(out, *SLOW, "--set", f"tune.n_trials={n}", "--workers", "2", cache=cache)
    victim = wait_for_running(lambda: journal(out), 1)
    pid = int(victim.user_attrs["worker"].split(":")[1])
    os.kill(pid, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-4000:]
    table = rows(out)
    assert len(finished(table)) == n
    killed = table[victim.number]
    assert killed["outcome"] == "lost" and killed["state"] == "FAIL"
    reruns = [r for r in table if r["retry_of"] == str(victim.number)]
    assert len(reruns) == 1 and reruns[0]["outcome"] == "complete" and reruns[0]["search.arch_lr"] == killed["search.arch_lr"]
    done = {int(r["number"]) for r in finished(table)}
    written = {int(Path(p).parts[-3]) for p in glob.glob(str(out / "trials" / "*" / "search" / "genotype.json"))}
    assert written == done  # every finished trial wrote its genotype once, no other trial did
    again = tune(out, *SLOW, "--set", f"tune.n_trials={n}", "--workers", "2", cache=cache)
    assert f"{n}/{n} finished" in again.stdout and len(rows(out)) == len(table)


def test_journal_killed_command_rerun_redoes_the_trial(tmp_path, cache):
    out, n = tmp_path / "journal-cmd", 2
    proc = start(out, *SLOW, "--set", f"tune.n_trials={n}", cache=cache)
    victim = wait_for_running(lambda: journal(out), 0)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    again = tune(out, *SLOW, "--set", f"tune.n_trials={n}", cache=cache)
    assert f"trials [{victim.number}] were running when their command died" in again.stderr
    table = rows(out)
    assert len(finished(table)) == n and table[victim.number]["outcome"] == "lost"
    assert [r["outcome"] for r in table if r["retry_of"] == str(victim.number)] == ["complete"]


def test_bad_input_is_refused_before_any_trial(tmp_path, cache):
    missing = tune(tmp_path / "nodata", *FAST, "--set", "data.corpus=/nonexistent/corpus.txt", cache=cache, check=False)
    assert missing.returncode == 2 and "/nonexistent/corpus.txt" in missing.stderr and "Traceback" not in missing.stderr
    assert not (tmp_path / "nodata" / "trials").exists()
    (tmp_path / "single").mkdir()
    (tmp_path / "single" / "genotype.json").write_text("{}")
    single = tune(tmp_path / "single", *FAST, cache=cache, check=False)
    assert single.returncode == 2 and "holds a single search or retrain run" in single.stderr
    storage = tune(tmp_path / "new", *FAST, "--set", "tune.storage=sqlite:////nonexistent/dir/t.db", cache=cache, check=False)
    assert storage.returncode == 2 and "tune.storage sqlite:////nonexistent/dir/t.db: cannot open the database" in storage.stderr
    assert not (tmp_path / "new").exists()  # refused before anything was written
    workers = tune(tmp_path / "w", *FAST, "--workers", "0", cache=cache, check=False)
    assert workers.returncode == 2 and "--workers must be a positive integer" in workers.stderr
    plain = subprocess.run([sys.executable, str(ROOT / "search.py"), "--workers", "2", "--set", "race.enabled=false"],
                           capture_output=True, text=True)
    assert plain.returncode == 2 and "--workers needs --tune, --seeds or the race" in plain.stderr


def test_second_command_on_the_same_folder_is_refused(tmp_path, cache):
    out = tmp_path / "locked"
    out.mkdir()
    import fcntl

    with open(out / "tune.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = tune(out, *FAST, cache=cache, check=False)
    assert proc.returncode == 2 and "another 'search.py --tune' is running on this folder" in proc.stderr


# --- PostgreSQL ----------------------------------------------------------------------------------


def _pg_bindir() -> Path | None:
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(d, "initdb").exists():
            return Path(d)
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _unavailable(reason: str):
    if os.environ.get("AUTOLN_REQUIRE_POSTGRES"):
        pytest.fail(f"PostgreSQL test required (AUTOLN_REQUIRE_POSTGRES) but {reason}")
    pytest.skip(f"{reason}; .ci/run installs Debian's postgresql")


@pytest.fixture(scope="module")
def postgres():
    """A throw-away PostgreSQL server on 127.0.0.1 (trust auth, fsync off); yields its base URL."""
    bindir = _pg_bindir()
    if bindir is None:
        _unavailable("no PostgreSQL server binaries (initdb) found")
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        _unavailable("the driver psycopg2 is not installed (pip install -e '.[dev]')")
    as_user: list[str] = []
    base = Path(tempfile.mkdtemp(prefix="autoln-pg-"))
    if os.geteuid() == 0:  # the server refuses to run as root
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            _unavailable("running as root and there is no 'postgres' user to run the server as")
        os.chown(base, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = base / "data"
    subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "autoln", "--auth=trust", "-E", "UTF8",
                    "--no-sync"], check=True, capture_output=True)
    subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(base / "log"), "-w", "-o",
                    f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50", "start"],
                   check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg2://autoln@127.0.0.1:{port}"
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _database(base_url: str, name: str) -> str:
    import psycopg2

    port = int(base_url.rsplit(":", 1)[1])
    conn = psycopg2.connect(host="127.0.0.1", port=port, user="autoln", dbname="postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    conn.close()
    return f"{base_url}/{name}"


def test_postgres_two_commands_share_one_study_with_an_exact_cap(postgres, tmp_path, cache):
    """Two commands (as on two machines) against one PostgreSQL study with a global cap of N:
    exactly N trials finish, each run once, by one of them."""
    url, n = _database(postgres, "two_workers"), 6
    procs = [start(tmp_path / f"machine{rank}", *FAST, "--set", "search.steps=60", "--set", f"tune.storage={url}",
                   "--set", f"tune.n_trials={n}", "--set", f"tune.rank_offset={rank}", cache=cache, threads=1)
             for rank in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-4000:]
    study = load_study(url)
    from autoln.tune import census

    assert census(study).finished == n
    done = {t.number for t in study.trials if t.user_attrs.get("outcome") == "complete"}
    assert len(done) == n
    by_machine = [{int(Path(p).parts[-3]) for p in glob.glob(str(tmp_path / f"machine{r}" / "trials" / "*" / "search" / "genotype.json"))}
                  for r in (0, 1)]
    assert by_machine[0] | by_machine[1] == done and not by_machine[0] & by_machine[1]
    assert all(by_machine), "both commands ran trials"
    workers = {t.user_attrs["worker"].rsplit(":", 1)[1] for t in study.trials if t.number in done}
    assert workers == {"rank0", "rank1"}


def test_postgres_killed_worker_fails_by_heartbeat_and_is_rerun(postgres, tmp_path, cache):
    url, n, out = _database(postgres, "killed"), 2, tmp_path / "pg"
    args = (*SLOW, "--set", f"tune.storage={url}", "--set", f"tune.n_trials={n}",
            "--set", "tune.heartbeat_interval=1", "--set", "tune.grace_period=4")
    proc = start(out, *args, cache=cache)
    victim = wait_for_running(lambda: url, 0)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    tune(out, *args, cache=cache)
    table = rows(out)
    assert len(finished(table)) == n
    assert table[victim.number]["state"] == "FAIL" and table[victim.number]["outcome"] == "lost"
    assert [r["outcome"] for r in table if r["retry_of"] == str(victim.number)] == ["complete"]


def test_a_long_differing_value_is_cut_in_the_one_line_error():
    """A differing ``tune.space`` (a dict) is shown in at most 60 characters, so the refusal stays
    readable; short values are shown whole."""
    from autoln.tune.storage import _clipped_repr

    space = {"search.arch_lr": {"log-uniform": [1e-4, 3e-2]}, "search.lr": {"log-uniform": [5e-4, 5e-3]}}
    assert _clipped_repr(space) == repr(space)[:57] + "..." and len(_clipped_repr(space)) == 60
    assert _clipped_repr(100) == "100" and _clipped_repr("cosine") == "'cosine'"


def test_a_study_without_a_reported_value_draws_no_empty_plot_and_logs_no_optuna_warning(tmp_path, capfd):
    import optuna

    from autoln.tune.report import _plots

    study = optuna.create_study()
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)  # no trial completed, none reported
    capfd.readouterr()
    notes = _plots(study, tmp_path, [])
    assert "plots/intermediate_values.png not drawn: no trial reported a valid loss at an evaluation yet" in notes
    err = capfd.readouterr().err
    assert "plot_intermediate_values" not in err and not (tmp_path / "plots" / "intermediate_values.png").exists()
