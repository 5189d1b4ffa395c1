# A method the shim wraps, pickled (test_engine.py test_a_wrapped_method_pickles_by_name_as_ray_ships_an_actor_class):
# by name, as Python pickles a method, so the process that loads it gets its own attribute. The Ray route:
# ray.remote(cls) closes a tracing wrapper over each method read off the class, then ships the class by value
# with cloudpickle (ray/actor.py _make_actor, ray/util/tracing/tracing_helper.py _inject_tracing_into_class).
import json
import pickle

import cloudpickle
import toy_patches
import toyup.core

from shim.engine import registry

E = toyup.core.Engine


def traced(method):
    def _resume_span(self, *args, **kwargs):
        return method(self, *args, **kwargs)
    return _resume_span


def actor_class():
    return type("Engine", (E,), {"generate": traced(E.generate)})  # dynamic: cloudpickle ships it by value


registry.activate([toy_patches.OK, toy_patches.SECOND])
out = {"same": E.generate is E.generate, "class": E.generate(E(), "x")}
shipped = cloudpickle.dumps(actor_class())
out["here"] = cloudpickle.loads(shipped)().generate("x")
bound = pickle.loads(pickle.dumps(E().generate))
out["bound"] = [bound("x"), type(bound.__self__).__name__]
plain_class = pickle.dumps(E.generate)
registry.remove("toy-ok")  # the lower layer: the class lookup must not keep it
out["class_after"] = E.generate(E(), "x")
registry.remove("toy-second")
out["there"] = cloudpickle.loads(shipped)().generate("x")  # where the shim is not active: upstream's method
out["plain"] = pickle.loads(plain_class)(E(), "x")
print(json.dumps(out))
