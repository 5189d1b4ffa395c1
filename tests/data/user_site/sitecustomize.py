"""A user's own sitecustomize: leaves evidence in the process that ran it (its pid on ``sys``),
which a child cannot inherit the way it inherits an environment variable."""
import os
import sys

sys.user_sitecustomize_pid = os.getpid()
os.environ["USER_SITECUSTOMIZE_RAN"] = "1"
