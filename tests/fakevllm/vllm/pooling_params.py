"""Mirrors vllm/pooling_params.py PoolingParams (placeholder)."""


class PoolingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)
