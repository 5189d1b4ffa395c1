# After mla.py (test_fake.py test_mla_below_016_impl_and_no_layerwise): no model_loader.reload module, the
# matrices on layer.impl. A test_fake.py body (after children/prelude.py).
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude and mla.py, which this body follows
    from children.mla import mla
    from children.prelude import RESULT

try:
    import vllm.model_executor.model_loader.reload  # noqa: F401
    RESULT["reload_module"] = True
except ModuleNotFoundError:
    RESULT["reload_module"] = False
RESULT["on_impl"] = mla.impl is not None and "W_UV" in vars(mla.impl) and "W_UV" not in vars(mla)
