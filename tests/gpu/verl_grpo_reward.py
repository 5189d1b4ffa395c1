"""verl's custom reward function for tests/gpu/verl_grpo.sh (``reward.custom_reward_function.path/name``,
verl 0.9.1 calls it as ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)``):
length-based, the number of words of the decoded response capped at 16, over 16 (0..1). A pure function
of the text, so equal responses give equal rewards."""

CAP = 16


def compute_score(data_source=None, solution_str="", ground_truth=None, extra_info=None, **kwargs):
    return min(len(solution_str.split()), CAP) / CAP
