"""TRL's colocated push and vLLM's post-processing (patches/trl_push_reprocess.py, issue 19 item 1).

A real TRL GRPOTrainer trains a tiny DeepSeek-V2 (multi-head latent attention) on the vLLM stand-in,
whose ``kv_b_proj`` is quantized (``FAKEVLLM_QUANTIZATION=fp8``: what vLLM's MLA derives from it,
``W_UK_T`` / ``W_UV``, are then its own tensors in the weights pool, as in vLLM 0.24 with a quantized
``kv_b_proj``; unquantized they are views of the weight and no push can leave them stale). TRL pushes
with the raw ``model.load_weights([(name, param)])``, which runs no ``process_weights_after_loading``:
decode keeps the matrices of the checkpoint -- after the level-2 sleep of TRL's init, whatever the
re-mapped pages hold. At every generate the scenario records whether each layer's derived matrices are
the ones its current ``kv_b_proj`` gives (``derived``) and lie in the weights pool; after training the
trainer's own push writes the final weights and the engine's greedy completions are compared with a
fresh engine's loaded from the trainer's saved weights (``final``).

Failing half: TRL 1.16.0 with the shim off; 1.9.2 and the 0.x trainers with the shim on but this
patch disabled (with the shim off they generate from the initial checkpoint: huggingface/trl#5312,
and the disk reload re-derives from it). TRL 0.26.2 runs on the stand-in at vLLM 0.10.2, which has no
layerwise reload: there the touched attention layers are re-processed.
"""
import functools
import tempfile

from tests.support.trl_support import run_trl

MLA_ENV = {"FAKEVLLM_QUANTIZATION": "fp8"}


@functools.lru_cache(maxsize=None)
def run(version, shim="before", disabled=""):
    out = tempfile.mkdtemp(prefix=f"trl-mla-{version}-{shim}-")
    env = dict(MLA_ENV, **({"SHIM_DISABLED_PATCHES": disabled} if disabled else {}))
    return run_trl(version, out, "--model", "mla", "--final-compare", "--shim", shim, "--steps", "2", env=env)


def assert_fixed(result, patch_id):
    assert result["decisions"][patch_id] == "applied"
    generates = result["generates"]
    assert len(generates) == 4 and any(not g["checkpoint"] for g in generates)  # trained weights were pushed
    assert all(g["derived"] for g in generates), generates
    assert all(g["derived_in_pool"] for g in generates), generates  # re-derived into the storage they had
    assert result["final"]["equal"] is True, result["final"]
    assert result["mismatches"] == 0


def assert_stale(result):
    assert not all(g["derived"] for g in result["generates"]), result["generates"]
    assert result["final"]["equal"] is False, result["final"]


def test_trl_116_sync_weights():
    off = run("1.16.0", shim="off")
    assert_stale(off)
    assert not off["generates"][0]["derived"]  # TRL's init sleeps at level 2: the first push finds garbage
    assert_fixed(run("1.16.0"), "trl-push-reprocess")


def test_trl_192_sync_weights():
    off = run("1.9.2", shim="off")
    assert all(g["checkpoint"] for g in off["generates"])  # #5312: the disk reload, re-derived from the checkpoint
    assert not any(g["derived_in_pool"] for g in off["generates"])  # vLLM's reload re-derives outside the pool
    assert_stale(run("1.9.2", disabled="trl-push-reprocess"))
    assert_fixed(run("1.9.2"), "trl-push-reprocess")


def test_trl_0x_grpo_move_model_to_vllm():
    """0.26.2 on the stand-in at vLLM 0.10.2: no layerwise reload, the touched MLA layers re-processed."""
    assert_stale(run("0.26.2", disabled="trl-grpo-push-reprocess"))
    result = run("0.26.2")
    assert result["vllm"] == "0.10.2"
    assert_fixed(result, "trl-grpo-push-reprocess")


def test_probe_reads_the_push():
    from shim.trl.push_reload import _raw_push

    class Raw:
        def sync_weights(self):
            for name, param in self._iter_named_params():
                self.llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights([(name, param)])

    class Reloads:
        def sync_weights(self):
            runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
            runner.reload_weights(weights_iterator=self._iter_named_params(), is_checkpoint_format=True)

    class Server:
        def sync_weights(self):
            self.vllm_client.update_named_params(self._iter_named_params())

    assert _raw_push(Raw) is None
    assert _raw_push(Reloads).startswith("fixed upstream")
    assert _raw_push(Server).startswith("upstream shape changed")
