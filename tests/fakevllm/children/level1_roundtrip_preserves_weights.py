# test_fake.py test_level1_roundtrip_preserves_weights: a body that runs after children/prelude.py.
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from children.prelude import RESULT, mem, new_llm, toks, wfp

llm = new_llm()
fp0, t0 = wfp(llm), toks(llm)
f0 = mem.mem_get_info()[0]
llm.sleep(level=1)
RESULT["freed"] = mem.mem_get_info()[0] - f0
RESULT["sleeping"] = llm.llm_engine.is_sleeping()
try:
    toks(llm); RESULT["gen_asleep"] = "ok"
except RuntimeError as e:
    RESULT["gen_asleep"] = str(e)
llm.wake_up()
RESULT["same_fp"] = wfp(llm) == fp0
RESULT["same_toks"] = toks(llm) == t0
