"""The session fixture of this folder: ``group_run``, the one process group that
test_collectives.py, test_hooks.py and test_accuracy.py check (tests/host/ddp/group_run.py),
run once however many of them are selected."""
import pytest


@pytest.fixture(scope="session")
def group_run():
    pytest.importorskip("torch", reason="PyTorch is not installed (it comes with the 'ddp' "
                                        "extra: pip install -e '.[ddp]')")
    from tests.host.ddp import group_run

    return group_run.run()
