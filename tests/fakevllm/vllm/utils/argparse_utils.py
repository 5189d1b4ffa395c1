"""Mirrors vllm/utils/argparse_utils.py (vLLM > 0.11) ``FlexibleArgumentParser``: an ``ArgumentParser``
(upstream adds config-file and dash/underscore handling, not modelled)."""
import argparse


class FlexibleArgumentParser(argparse.ArgumentParser):
    pass
