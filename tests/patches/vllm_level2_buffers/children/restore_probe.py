# After kv_cache_first.py (test_level2_buffers.py test_stands_down_where_vllm_gates_the_restore): the
# buffer-restore probe on the release's Worker and the patch's decision. A stand_in body (after tests/support/children/stand_in_prelude.py).
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.stand_in_prelude import R

from vllm.v1.worker.gpu_worker import Worker

from shim.engine import registry
from shim.vllm.weights import buffers

R["probe"] = buffers.probe_restore(Worker)
R["decision"] = registry.decisions()["vllm-level2-buffers"].text()
