"""`localllm pull` against a hub stand-in on loopback (HF_ENDPOINT), with real downloads."""

from __future__ import annotations

import filecmp
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from localllm.backends.base import ModelRef
from localllm.cli import main
from localllm.config import load_settings
from localllm.models import hub as hubmod
from tests.conftest import starts_process
from tests.gguf_fixtures import tiny_projector
from tests.hubserver import HubServer, wait_for

GGUF_REPO = "test-org/tiny-GGUF"


@pytest.fixture
@starts_process
def hub(starter_ref: ModelRef, monkeypatch: pytest.MonkeyPatch):
    with HubServer() as server:
        server.add(
            GGUF_REPO,
            {
                "tiny-Q4_1.gguf": starter_ref.path,
                "tiny-Q8_0.gguf": starter_ref.path,
                "README.md": Path(__file__),
            },
        )
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield server


def models_dir() -> Path:
    return load_settings().models_dir


def store_entries() -> list[str]:
    """What the store shows: everything but hidden (unfinished) entries."""
    folder = models_dir()
    return (
        sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
        if folder.is_dir()
        else []
    )


def gets(server: HubServer, file: str) -> list[str]:
    """The Range headers of the downloads of `file` (the header probe excluded)."""
    return [
        r
        for m, p, r in server.log
        if m == "GET" and p.endswith(file) and not r.startswith("bytes=0-")
    ]


def test_ambiguous_repo_lists_the_choices(
    hub: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pull", GGUF_REPO]) == 1
    err = capsys.readouterr().err
    assert "several GGUF files" in err
    assert f"{GGUF_REPO}:tiny-Q4_1 (93.8 MiB)" in err and f"{GGUF_REPO}:tiny-Q8_0" in err
    assert store_entries() == []


def test_pull_gguf_by_quant_then_run_it(
    hub: HubServer, starter_ref: ModelRef, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pull", f"{GGUF_REPO}:Q4_1"]) == 0
    out = capsys.readouterr().out
    # the memory estimate came from the GGUF header, fetched before the download
    assert "Memory: needs about" in out and "KV 90.0 MiB at 4096 tokens" in out and ": fits" in out
    pulled = models_dir() / "tiny-Q4_1" / "tiny-Q4_1.gguf"
    assert filecmp.cmp(pulled, starter_ref.path, shallow=False)
    provenance = (models_dir() / "tiny-Q4_1" / "localllm.json").read_text()
    assert GGUF_REPO in provenance and hub.repos[GGUF_REPO].commit in provenance
    assert main(["list"]) == 0
    assert any(  # the SOURCE column names the repository it was pulled from
        line.split()[0] == "tiny-Q4_1" and line.split()[-2:] == ["pulled:", GGUF_REPO]
        for line in capsys.readouterr().out.splitlines()
    )
    assert main(["info", "tiny-Q4_1"]) == 0
    info = capsys.readouterr().out
    assert f"pulled from      {GGUF_REPO} @ {hub.repos[GGUF_REPO].commit[:12]}" in info
    # a second pull finds it and downloads nothing
    before = len(gets(hub, "tiny-Q4_1.gguf"))
    assert main(["pull", f"{GGUF_REPO}:Q4_1"]) == 0
    assert "Already in the store" in capsys.readouterr().out
    assert len(gets(hub, "tiny-Q4_1.gguf")) == before
    assert main(["run", "Say hi", "--model", "tiny-Q4_1", "--max-tokens", "4"]) == 0
    assert capsys.readouterr().out.strip()
    # the string given to pull names the model too, with or without its quant
    for spec in (f"{GGUF_REPO}:Q4_1", GGUF_REPO, GGUF_REPO.upper()):
        assert main(["run", "Say hi", "--model", spec, "--max-tokens", "2"]) == 0, spec
        assert capsys.readouterr().out.strip()
    assert main(["info", f"{GGUF_REPO}:Q4_1"]) == 0
    assert "tiny-Q4_1" in capsys.readouterr().out


def test_pull_mlx_repository_whole(
    hub: HubServer, starter_mlx_ref: ModelRef, capsys: pytest.CaptureFixture[str]
) -> None:
    files = {p.name: p for p in starter_mlx_ref.path.iterdir() if p.is_file()}
    hub.add("test-org/tiny-mlx", files)
    assert main(["pull", "test-org/tiny-mlx"]) == 0
    folder = models_dir() / "tiny-mlx"
    for name, src in files.items():
        if name != "localllm.json":
            assert filecmp.cmp(folder / name, src, shallow=False), name
    assert "MLX, " in capsys.readouterr().out
    assert main(["info", "tiny-mlx"]) == 0
    info = capsys.readouterr().out
    assert "format           mlx" in info and "backend          mlx" in info
    assert main(["run", "Hi", "--model", "tiny-mlx", "--max-tokens", "2"]) == 0


def test_a_cut_transfer_resumes_to_identical_bytes(hub: HubServer, starter_ref: ModelRef) -> None:
    hub.cut_after["tiny-Q8_0.gguf"] = 30_000_000
    assert main(["pull", f"{GGUF_REPO}:Q8_0"]) == 0
    ranges = gets(hub, "tiny-Q8_0.gguf")
    assert ranges[0] == "" and ranges[1].startswith("bytes=") and ranges[1] != "bytes=0-", ranges
    resumed_at = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 30_000_000
    assert filecmp.cmp(
        models_dir() / "tiny-Q8_0" / "tiny-Q8_0.gguf", starter_ref.path, shallow=False
    )


def test_a_rate_limited_download_waits_and_goes_on(hub: HubServer, starter_ref: ModelRef) -> None:
    hub.throttle["tiny-Q8_0.gguf"] = 2  # HTTP 429 twice, then the file
    assert main(["pull", f"{GGUF_REPO}:Q8_0"]) == 0
    assert gets(hub, "tiny-Q8_0.gguf") == ["", "", ""]
    pulled = models_dir() / "tiny-Q8_0" / "tiny-Q8_0.gguf"
    assert filecmp.cmp(pulled, starter_ref.path, shallow=False)


def test_a_server_ignoring_the_range_restarts_the_file_and_its_hash(
    hub: HubServer, starter_ref: ModelRef
) -> None:
    hub.cut_after["tiny-Q8_0.gguf"] = 30_000_000
    hub.ignore_range.add("tiny-Q8_0.gguf")
    assert main(["pull", f"{GGUF_REPO}:Q8_0"]) == 0
    ranges = gets(hub, "tiny-Q8_0.gguf")
    assert len(ranges) == 2 and ranges[1].startswith("bytes=") and ranges[1] != "bytes=0-"
    pulled = models_dir() / "tiny-Q8_0" / "tiny-Q8_0.gguf"
    assert filecmp.cmp(pulled, starter_ref.path, shallow=False)


def test_a_killed_pull_leaves_nothing_and_resumes(
    hub: HubServer, starter_ref: ModelRef, capsys: pytest.CaptureFixture[str]
) -> None:
    hub.stall_after["tiny-Q4_1.gguf"] = 40_000_000
    child = subprocess.Popen(
        [sys.executable, "-m", "localllm", "pull", f"{GGUF_REPO}:Q4_1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ),
    )
    parts = models_dir() / ".pull-tiny-Q4_1"
    try:
        assert wait_for(
            lambda: any(p.stat().st_size >= 20_000_000 for p in parts.rglob("*.part")), 60
        ), "the child never got 20 MB"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert store_entries() == []
    assert main(["list"]) == 0
    assert "tiny-Q4_1" not in capsys.readouterr().out
    kept = next(parts.rglob("*.part")).stat().st_size
    hub.stall_after.clear()
    hub.stop_stalling.set()
    assert main(["pull", f"{GGUF_REPO}:Q4_1"]) == 0
    assert gets(hub, "tiny-Q4_1.gguf")[-1] == f"bytes={kept}-"
    assert filecmp.cmp(
        models_dir() / "tiny-Q4_1" / "tiny-Q4_1.gguf", starter_ref.path, shallow=False
    )
    assert not parts.exists()


def test_missing_repository(hub: HubServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pull", "test-org/no-such-model"]) == 1
    err = capsys.readouterr().err
    assert "no such repository at http://127.0.0.1:" in err and "HF_TOKEN" in err
    assert store_entries() == []


def test_hash_mismatch_is_refused_and_nothing_kept(
    hub: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    hub.altered.add("tiny-Q4_1.gguf")
    assert main(["pull", f"{GGUF_REPO}:Q4_1"]) == 1
    err = capsys.readouterr().err
    assert "SHA-256 of the download is" in err and "nothing was added to the store" in err
    assert store_entries() == []
    assert not list(models_dir().rglob("*.part"))


def test_gated_repository_needs_hf_token(
    hub: HubServer,
    starter_ref: ModelRef,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    hub.add("test-org/gated", {"gated-Q4_1.gguf": starter_ref.path}, token="hf_secret")
    assert main(["pull", "test-org/gated"]) == 1
    assert "gated" in capsys.readouterr().err
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert main(["pull", "test-org/gated"]) == 0
    assert store_entries() == ["gated-Q4_1"]


def test_no_network(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    assert main(["pull", GGUF_REPO]) == 1
    assert "no network?" in capsys.readouterr().err


def test_full_disk_is_refused_before_downloading(
    hub: HubServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a full file system cannot be staged without root; the free-space reading is faked
    real = hubmod.shutil.disk_usage
    monkeypatch.setattr(
        hubmod.shutil, "disk_usage", lambda p: real(p)._replace(free=10 * 1024 * 1024)
    )
    assert main(["pull", f"{GGUF_REPO}:Q4_1"]) == 1
    assert "needs 93.8 MiB more on disk and 10.0 MiB is free" in capsys.readouterr().err
    assert gets(hub, "tiny-Q4_1.gguf") == []
    assert store_entries() == []


def test_a_model_that_will_not_fit_is_not_pulled(
    hub: HubServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LOCALLLM_MEMORY_BUDGET_MB", "150")
    assert main(["pull", f"{GGUF_REPO}:Q4_1"]) == 1
    captured = capsys.readouterr()
    assert "does NOT fit" in captured.out and "150.0 MiB" in captured.out
    assert "will not fit in memory" in captured.err and "--force" in captured.err
    assert gets(hub, "tiny-Q4_1.gguf") == []
    assert main(["pull", f"{GGUF_REPO}:Q4_1", "--force"]) == 0
    assert store_entries() == ["tiny-Q4_1"]


@pytest.mark.parametrize(
    ("pattern", "picked"),
    [("Q4_K_M", "m-Q4_K_M.gguf"), ("q4_k_s", "m-Q4_K_S.gguf"), ("m-Q8_0.gguf", "m-Q8_0.gguf")],
)
def test_quant_names_match_whole(pattern: str, picked: str) -> None:
    files = [
        hubmod.RemoteFile(n, 1, None, None)
        for n in ("m-Q4_K_M.gguf", "m-Q4_K_S.gguf", "m-Q8_0.gguf")
    ]
    kind, chosen = hubmod.choose("o/r", files, pattern)
    assert kind == "gguf" and [f.path for f in chosen] == [picked]
    with pytest.raises(hubmod.DownloadFailed, match="choose one"):
        hubmod.choose("o/r", files, "Q4_K")  # both K quants: ambiguous, not the first


def test_split_gguf_pulls_all_shards() -> None:
    names = ["big-Q4_K_M-00001-of-00002.gguf", "big-Q4_K_M-00002-of-00002.gguf", "big-Q8_0.gguf"]
    files = [hubmod.RemoteFile(n, 1, None, None) for n in names]
    kind, chosen = hubmod.choose("o/r", files, "Q4_K_M")
    assert kind == "gguf" and [f.path for f in chosen] == names[:2]


def test_search_and_choices_through_huggingface_hub(hub: HubServer, starter_ref: ModelRef) -> None:
    """The in-app search: repositories with GGUF files that match, then what each offers
    (the listing and sizes come from the hub stand-in through huggingface_hub)."""
    found = hubmod.search("tiny")
    assert [(m.repo, m.kind) for m in found] == [(GGUF_REPO, "gguf")]
    assert hubmod.search("no-such-model") == []
    offered = hubmod.choices(GGUF_REPO)
    assert [(c.spec, c.label, c.size) for c in offered] == [
        (f"{GGUF_REPO}:tiny-Q4_1", "tiny-Q4_1", starter_ref.size_bytes),
        (f"{GGUF_REPO}:tiny-Q8_0", "tiny-Q8_0", starter_ref.size_bytes),
    ]
    assert hubmod.plan_pull(offered[1].spec).files[0].path == "tiny-Q8_0.gguf"  # it pulls


def test_search_offline_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(hubmod.DownloadFailed) as err:
        hubmod.search("tiny")
    message = err.value.message
    assert "cannot reach" in message and "no network?" in message and "\n" not in message


def test_a_vision_repository_pulls_its_projector_with_the_model(
    hub: HubServer, starter_ref: ModelRef, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proj = tiny_projector(tmp_path / "p.gguf")
    hub.add("test-org/seer-GGUF", {
        "seer-Q4_1.gguf": starter_ref.path,
        "mmproj-seer-Q8_0.gguf": proj,
        "mmproj-seer-f16.gguf": proj,
    })
    # the projectors are not models to choose among: one model, pulled with its projector
    assert main(["pull", "test-org/seer-GGUF"]) == 0
    folder = models_dir() / "seer-Q4_1"
    assert sorted(p.name for p in folder.glob("*.gguf")) == [
        "mmproj-seer-f16.gguf", "seer-Q4_1.gguf"]
    assert filecmp.cmp(folder / "mmproj-seer-f16.gguf", proj, shallow=False)
    capsys.readouterr()
    assert main(["list"]) == 0
    listed = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert listed["seer-Q4_1"][7] == "text,image"  # its INPUT column (SIZE is two words)
    assert not any("mmproj" in name for name in listed)
    assert main(["info", "seer-Q4_1"]) == 0
    assert "vision" in capsys.readouterr().out


def test_the_projector_chosen_is_the_full_precision_one() -> None:
    names = ["m-Q4_K_M.gguf", "mmproj-m-Q8_0.gguf", "mmproj-m-BF16.gguf", "mmproj-m-F16.gguf"]
    files = [hubmod.RemoteFile(n, 1, None, None) for n in names]
    kind, chosen = hubmod.choose("o/r", files, "")
    assert kind == "gguf"
    assert [f.path for f in chosen] == ["m-Q4_K_M.gguf", "mmproj-m-F16.gguf"]
    _kind, chosen = hubmod.choose("o/r", files[:2], "Q4_K_M")
    assert [f.path for f in chosen] == ["m-Q4_K_M.gguf", "mmproj-m-Q8_0.gguf"]


def test_a_hub_listing_a_name_that_leaves_the_model_folder_pulls_nothing(
    hub: HubServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hostile (or broken) hub lists '../../.bashrc' in an MLX repository, laid out as
    listed: the pull is refused whole, naming the file, and nothing is written."""
    planted = tmp_path / "payload"
    planted.write_text("export EVIL=1\n")
    config = tmp_path / "config.json"
    config.write_text("{}")
    hub.add("test-org/hostile-mlx", {"config.json": config, "../../../.bashrc": planted})
    assert main(["pull", "test-org/hostile-mlx"]) == 1
    err = capsys.readouterr().err
    assert "the hub lists a file named '../../../.bashrc'" in err
    assert "nothing was downloaded" in err
    assert store_entries() == []
    assert not any(p.name == ".bashrc" for p in models_dir().parent.rglob(".bashrc"))


def test_pulls_of_one_model_at_once_share_one_download(
    hub: HubServer, starter_ref: ModelRef
) -> None:
    """Three pulls of one file at once (three clients): they take turns on the model's
    lock; the first downloads, the others find the same model in the store (#52: they
    used to append to one .part file and all fail)."""
    import threading

    plan = hubmod.plan_pull(f"{GGUF_REPO}:Q8_0")
    results: list[Path | BaseException] = []

    def one() -> None:
        try:
            results.append(hubmod.pull(plan, models_dir()))
        except BaseException as exc:  # the test reports it
            results.append(exc)

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(results) == 3 and all(isinstance(r, Path) for r in results), results
    assert len(set(results)) == 1
    assert filecmp.cmp(
        models_dir() / "tiny-Q8_0" / "tiny-Q8_0.gguf", starter_ref.path, shallow=False
    )
    assert len([g for g in gets(hub, "tiny-Q8_0.gguf") if g == ""]) == 1  # one download
    assert store_entries() == ["tiny-Q8_0"]
