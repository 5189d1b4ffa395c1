"""One row per upstream bug (or shim feature): the unit ``status``, ``doctor``, the disable list and the tables speak of.

A bug has sites: the ``Patch`` records naming it (``INDEX``'s fourth column), one per hooked module and
release range. ``SHIM_DISABLED_PATCHES=<bug id>`` turns off every site; a site id still works alone.
Read only by the commands (``status``, ``doctor``, ``python -m shim.cli.table``), never at start-up.

``Bug(id, reference, problem, when, needs)``:
  reference  a link to the upstream issue or PR; None for a bug reported nowhere (found here) or a feature
  problem    what goes wrong without the shim, in a few words (a feature: what it adds)
  when       the feature of a run the bug needs besides the affected release ("PEFT LoRA"), "" if every run
             with sleep mode is hit; ``doctor`` lists such a bug as "if you use ..." and never fails on it
  needs      the other distributions it needs installed to bite (a TRL bug needs vLLM)
"""


class Bug:
    __slots__ = ("id", "reference", "problem", "when", "needs")

    def __init__(self, id, reference, problem, when="", needs=()):
        self.id, self.reference, self.problem, self.when, self.needs = id, reference, problem, when, tuple(needs)

    def __repr__(self):
        return f"Bug({self.id!r})"


def _gh(ref):
    """``owner/repo#N`` -> its GitHub link (an issue link reaches a PR as well)."""
    repo, number = ref.split("#")
    return f"https://github.com/{repo}/issues/{number}"


V = ("vllm",)
BUGS = (
    Bug("trl-stale-weights", _gh("huggingface/trl#5312"), "rollouts generated from the initial checkpoint", "", V),
    Bug("trl-level2-resync", None, "GRPO/RLOO rollouts from discarded weights after a level-2 sleep", "", V),
    Bug("trl-online-dpo-resync", None, "OnlineDPO rollouts from discarded weights after a level-2 sleep",
        "OnlineDPOTrainer", V),
    Bug("trl-gold-weights-asleep", None, "GOLD rollouts from weights still asleep", "GOLDTrainer", V),
    Bug("mla-push-reprocess", _gh("vllm-project/vllm#42821"),
        "a push leaves post-processed weights (MLA W_UK_T/W_UV) at the old values", "an MLA model (DeepSeek)", V),
    Bug("swift-wake-order", _gh("modelscope/ms-swift#10109"),
        "a second rollout in a step wakes the weights before the trainer is offloaded",
        "a second rollout in one step (dynamic sampling, GKD, evaluation) with offloading", V),
    Bug("swift-level2-gap", "https://github.com/modelscope/ms-swift/pull/7017",
        "rollouts from discarded weights after a level-2 sleep", "", V),
    Bug("swift-level2-lora-adapter", "https://github.com/modelscope/ms-swift/pull/7017",
        "vLLM LoRA rollouts without the adapter after a level-2 sleep", "--vllm_enable_lora", V),
    Bug("swift-alloc-conf", _gh("modelscope/ms-swift#6636"),
        "ms-swift turns expandable segments on around the engine: sleeps free nothing", "", V),
    Bug("swift-gkd-teacher-oom", _gh("modelscope/ms-swift#6639"),
        "GKD loads a ZeRO-3 teacher whole on every rank (OOM)", "GKD with a ZeRO-3 teacher", ("deepspeed",)),
    Bug("swift-offload-under-zero3", _gh("modelscope/ms-swift#7801"),
        "--offload_model under ZeRO-3 moves nothing off the GPU", "--offload_model with --deepspeed zero3",
        ("deepspeed", "vllm")),
    Bug("swift-offload-reload", _gh("modelscope/ms-swift#10109"),
        "offload_context loads models onto the device it never moved off it", "--offload_model", V),
    Bug("allocator-guard", _gh("modelscope/ms-swift#6636"),
        "expandable segments at construction put the engine outside the sleep pool: sleeps free nothing",
        "expandable segments"),
    Bug("sleep-check", _gh("modelscope/ms-swift#6636"),
        "what each sleep freed, checked"),
    Bug("vllm-torch-cap-sleep", None, "vLLM 0.34's torch memory cap outlives the sleep: freed memory unusable"),
    Bug("vllm-core-wake-plan", None, "a wake naming a tag already awake is dropped whole (engine stays asleep)",
        "a wake naming an awake tag (ms-swift)"),
    Bug("trl-encoder-cache", _gh("huggingface/trl#7198"), "image embeddings of old weights reused after a push",
        "image inputs (VLM)", V),
    Bug("trl-lora-drift", None, "the in-place LoRA merge of the push drifts the frozen base", "PEFT LoRA", V),
    Bug("swift-lora-drift", None, "the in-place LoRA merge of the push drifts the frozen base", "LoRA", V),
    Bug("trl-sleep-level", None, "TRL's colocated sleep level", "", V),
    Bug("vllm-prefix-reset-check", _gh("vllm-project/vllm#28827"),
        "a failed prefix-cache reset after a push is ignored: old KV reused", "pushes with requests in flight"),
    Bug("level2-buffers", _gh("vllm-project/vllm#45619"),
        "a kv_cache wake before the weights wake after a level-2 sleep loses the buffers",
        "kv_cache-first wakes (TRL GOLD)"),
    Bug("vllm-ascend-moe-wake-layout", _gh("vllm-project/vllm-ascend#11548"),
        "the NPU wake re-transposes MoE weights (garbage rollouts)", "an MoE model"),
    Bug("level2-tensors", _gh("vllm-project/vllm#53343"),
        "a level-2 sleep loses plain tensors allocated in the weights pool",
        "level 2 with an MLA model"),
    Bug("vllm-level2-drafter", _gh("vllm-project/vllm#52479"),
        "a level-2 sleep discards the drafter's weights, which no push refills", "speculative decoding"),
    Bug("verify-weights", None, "engine vs trainer weights, per rollout"),
    Bug("verl-mtp-sleep-level", _gh("volcengine/verl#6661"),
        "a level-2 sleep discards the MTP drafter's weights", "MTP speculative decoding", V),
    Bug("verl-vlm-encoder-cache", _gh("volcengine/verl#6523"), "image embeddings of old weights reused after an update",
        "image inputs (VLM)", V),
    Bug("shim-metrics", None, "shim/ figures, stale-rollout alarm"),
    Bug("ray-cluster-workers", None, "the shim in the actors of a `ray start` cluster, from the driver (no install "
        "on the nodes)", "a cluster started with `ray start`"),
)
