"""Mirrors vllm/platforms/__init__.py ``current_platform`` (CudaPlatform, or
the vllm-ascend NPUPlatform when FAKEVLLM_DEVICE=npu)."""
from vllm import _fake


class Platform:
    def __init__(self, device_type: str):
        self.device_type = device_type
        self.device_name = device_type
        self.dispatch_key = "CUDA" if device_type == "cuda" else "PrivateUse1"
        self.ray_device_key = "GPU" if device_type == "cuda" else "NPU"
        self.device_control_env_var = ("CUDA_VISIBLE_DEVICES" if device_type == "cuda"
                                       else "ASCEND_RT_VISIBLE_DEVICES")
        self.simple_compile_backend = "inductor"
        self.dist_backend = "nccl" if device_type == "cuda" else "hccl"

    def is_cuda(self) -> bool:
        return self.device_type == "cuda"

    def is_cuda_alike(self) -> bool:
        return self.device_type == "cuda"

    def is_rocm(self) -> bool:
        return _fake.ROCM

    def is_cpu(self) -> bool:
        return False

    def is_tpu(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_out_of_tree(self) -> bool:
        return self.device_type == "npu"

    def is_sleep_mode_available(self) -> bool:
        return True

    def get_device_name(self, device_id: int = 0) -> str:
        return "NVIDIA H200 (fake)" if self.device_type == "cuda" else "Ascend910B (fake)"

    def get_device_total_memory(self, device_id: int = 0) -> int:
        return _fake.device.DEVICE.total

    def empty_cache(self):
        _fake.device.DEVICE.empty_cache()

    def synchronize(self):
        _fake.device.DEVICE.synchronize()

    def mem_get_info(self):
        return _fake.device.DEVICE.mem_get_info()

    def __repr__(self):
        return f"FakePlatform(device_type={self.device_type!r})"


current_platform = Platform(_fake.DEVICE_TYPE)
