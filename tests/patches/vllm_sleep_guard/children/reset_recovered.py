# The first-sleep reset's re-check logs a recovered engine (test_sleep_check.py test_reset_recovered_branch),
# in-process, no vLLM: prints the reset's state.
from shim.vllm.sleep import first_sleep_reset, sleep_state

s = sleep_state.SleepState(measure=sleep_state.Measurement(sleep_mode=True, engine_bytes=40 << 30, reset="pending", wakes=1))
first_sleep_reset.outcome(s, "LLMEngine#1", True, 40 << 30, 40 << 30, "")
first_sleep_reset.outcome(s, "LLMEngine#2", True, 40 << 30, 40 << 30, "", reissued=True)
print(s.measure.reset)
