"""verl 0.9.1 GRPO run of tests/gpu/verl_grpo.sh (issue 21 item 5): a seeded agent loop (reward: verl_grpo_reward.py).

- ``SeededSingleTurnAgentLoop`` (registered as ``seeded_single_turn`` through
  ``actor_rollout_ref.rollout.agent.agent_loop_config_path``): verl's own ``single_turn_agent`` with a
  per-request vLLM sampling seed. verl's ``full_determinism`` gives every request the SAME seed (all n
  samples of a GRPO group identical, zero advantage) and without it the engine's global generator is
  consumed in request arrival order (agent-loop workers race); here the k-th request of dataset row
  ``index`` in one agent-loop worker gets seed ``f(index, k)``. The seed is assigned before the first
  ``await`` of ``run``, i.e. in verl's task creation order, which is deterministic.
"""
from __future__ import annotations

import collections

from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop


class SeededSingleTurnAgentLoop(SingleTurnAgentLoop):
    _seen: "collections.Counter" = collections.Counter()

    async def run(self, sampling_params, **kwargs):
        index = int(kwargs.get("index", 0))
        k = SeededSingleTurnAgentLoop._seen[index]
        SeededSingleTurnAgentLoop._seen[index] += 1
        params = dict(sampling_params)
        params["seed"] = (1_000_003 * (index + 1) + 7919 * k) % (2**31 - 1)
        return await super().run(params, **kwargs)
