"""Dynamic broker configs (Kafka's KIP-226): settings AlterConfigs and IncrementalAlterConfigs change on a BROKER
resource while the broker runs, per broker or as the cluster-wide default, stored durably and reported by
DescribeConfigs with their levels. keys.py: which settings and their checks; store.py: where they are kept;
settings.py: the settings in force and how a change reaches the subsystems."""
from kop.dynamic.keys import BrokerConfigError
from kop.dynamic.settings import DEFAULT_LEVEL, BrokerSettings

__all__ = ["BrokerConfigError", "BrokerSettings", "DEFAULT_LEVEL"]
