"""The one ``class_path`` loader (lightning_pfd/classpath.py) and its users' error behaviour.

Oracles: the objects themselves (``is`` identity with the imported class), Python's own import
errors for names that do not exist."""
import collections

import pytest

from lightning_pfd.classpath import import_class
from lightning_pfd.errors import ConfigError
from lightning_pfd.evaluation.flow import metric_factory
from lightning_pfd.metrics import ProbabilityFlowDistance


def test_import_class_returns_the_named_object():
    assert import_class("collections.OrderedDict") is collections.OrderedDict
    assert import_class("lightning_pfd.metrics.pfd.ProbabilityFlowDistance") is ProbabilityFlowDistance


@pytest.mark.parametrize("path, error", [("no_such_pkg_xyz.Metric", ImportError),
                                         ("collections.NoSuchName", AttributeError),
                                         ("OrderedDict", ValueError)])
def test_import_class_raises_the_import_error(path, error):
    with pytest.raises(error):
        import_class(path)


def test_metric_factory_loads_through_it_and_names_the_field():
    factory, reference = metric_factory({"class_path": "lightning_pfd.metrics.pfd.ProbabilityFlowDistance",
                                         "reference": "empirical"}, "m.sw")
    assert factory.func is ProbabilityFlowDistance and reference == "empirical"
    for bad in ("no_such_pkg_xyz.Metric", "collections.NoSuchName", "OrderedDict"):
        with pytest.raises(ConfigError) as err:
            metric_factory({"class_path": bad}, "m.sw")
        assert err.value.field == "m.sw.class_path" and bad in str(err.value)
