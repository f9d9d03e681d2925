"""docs/bring-up.md "The steps, as run": the page's shell block, exactly as written, run in
a network namespace of its own (``unshare -n``, as the page says), with the Verilated
network top behind a TAP. The block must run to its end with every command succeeding
(``bash -e``): the virtualenv activated, ``lo`` brought up before the training run, the
board in the background of the same shell, ``ping`` only where it is installed.

The checks of the block's text run everywhere; the run itself is skipped, saying why,
where the machine allows no network namespace or has no ``/dev/net/tun``, as
``test_tap.py``'s rehearsal is."""
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, namespace_command

PAGE = REPO / "docs" / "bring-up.md"
#: the first start builds the Verilator harness (minutes); the steps take about two
TIMEOUT = 1500


def page_block(text=None):
    """The shell block of the page's "The steps, as run"."""
    text = PAGE.read_text() if text is None else text
    section = text.split("### The steps, as run", 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"^```sh\n(.*?)^```$", section, flags=re.S | re.M)
    assert len(blocks) == 1, f"{len(blocks)} sh blocks in 'The steps, as run'"
    return blocks[0]


def commands(block):
    """The block's command lines (comments and blank lines left out)."""
    return [line.strip() for line in block.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_the_block_sets_up_what_a_fresh_namespace_lacks():
    lines = commands(page_block())
    # the virtualenv first: everything after runs its gradwire and its python
    assert lines[0] == ". .venv/bin/activate"
    # lo up before anything uses it (the training run's gloo ranks)
    lo = lines.index("ip link set lo up")
    training = next(n for n, line in enumerate(lines) if line.startswith("gradwire accuracy"))
    assert lo < training
    # the board in the background of the same shell (a second terminal is another
    # namespace), stopped at the end
    serve = [line for line in lines if line.startswith("gradwire board serve")]
    assert len(serve) == 1 and serve[0].rstrip().endswith("&")
    assert any(line.startswith("kill ") for line in lines[lines.index(serve[0]):])
    # no tool the machine may lack, unguarded
    for tool in ("ping", "tcpdump"):
        bare = [line for line in lines if re.match(rf"{tool}\b", line)]
        assert not bare, f"{tool} is not installed everywhere: {bare}"


def test_the_checks_catch_a_block_without_lo():
    broken = PAGE.read_text().replace("ip link set lo up\n", "")
    with pytest.raises(ValueError):
        commands(page_block(broken)).index("ip link set lo up")


@pytest.fixture(scope="module")
def namespace():
    if not os.path.exists("/dev/net/tun"):
        pytest.skip("no /dev/net/tun (TUN/TAP driver not loaded, or not in this container)")
    command, why = namespace_command("ip tuntap add dev probe0 mode tap", "a TAP")
    if command is None:
        pytest.skip(why)
    return command


@pytest.mark.slow
def test_the_page_runs_as_written(namespace, tmp_path):
    """The block in ``bash -e`` under ``unshare -n``, from a folder whose ``.venv`` is the
    virtualenv running the tests (its files, ``grad.npy`` and the rest, land there)."""
    (tmp_path / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADWIRE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    script = "set -e -o pipefail\n" + page_block()
    process = subprocess.Popen([*namespace, "bash", "-c", script], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        out, err = "", f"the page's block took over {TIMEOUT} s"
    finally:
        # the block's session: a board left in the background when a command failed
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if process.returncode is None:
            process.communicate()
    log = (tmp_path / "serve.log").read_text() if (tmp_path / "serve.log").exists() else ""
    assert process.returncode == 0, f"{out[-3000:]}\n{err[-3000:]}\nserve.log: {log}"
    assert "ready on TAP gw0: board 192.168.77.2" in log
    assert "stopped after" in log.strip().splitlines()[-1] and "Traceback" not in log
    assert "link up" in out
    assert "192.168.77.2 lladdr 02:47:57:00:00:01" in out
    assert re.search(r"ratio [\d.]+x", out)
    codecs = set(re.findall(r"^\| digits .*?\| (inceptionn-k10|lhc) ", out, re.M))
    assert codecs == {"inceptionn-k10", "lhc"}, out[-3000:]
    assert "Traceback" not in err
