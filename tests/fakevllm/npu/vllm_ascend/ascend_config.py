"""Mirrors vllm_ascend/ascend_config.py ``get_ascend_config`` (0.19+; the fields NPUWorker's sleep and wake
read): ``weight_nz_mode`` from ``VLLM_ASCEND_ENABLE_NZ`` (additional_config not modelled), and
``enable_sleep_mode_extra_cleanup`` off (its default)."""
from vllm_ascend import envs as envs_ascend


class AscendConfig:
    def __init__(self):
        self.weight_nz_mode = envs_ascend.VLLM_ASCEND_ENABLE_NZ
        self.enable_sleep_mode_extra_cleanup = False


def get_ascend_config() -> AscendConfig:
    return AscendConfig()
