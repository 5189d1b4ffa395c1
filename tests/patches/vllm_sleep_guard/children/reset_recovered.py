# The first-sleep reset's re-check logs a recovered engine (test_sleep_check.py test_reset_recovered_branch),
# in-process, no vLLM: prints the reset's state.
from shim.vllm.sleep import sleep_state, sleep_verdict

for name, reissued in (("LLMEngine#1", False), ("LLMEngine#2", True)):
    s = sleep_state.SleepState(engine=name, measure=sleep_verdict.Measurement(sleep_mode=True, engine_bytes=40 << 30,
                                                                               reset="pending", wakes=1))
    s.reset_outcome(True, 40 << 30, 40 << 30, "", reissued=reissued)
print(s.measure.reset)
