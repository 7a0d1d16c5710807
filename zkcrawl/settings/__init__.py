"""Typed, frozen settings for every command, with one precedence rule (SPEC §4):
flag > environment > TOML file (``--config``) > default.

One module per concern: :mod:`~zkcrawl.settings.options` (declaring and naming an option),
:mod:`~zkcrawl.settings.common` (the shared flags), :mod:`~zkcrawl.settings.sources`
(flags, environment, file, and the precedence rule), :mod:`~zkcrawl.settings.config_file`
(the TOML file), :mod:`~zkcrawl.settings.decode` (raw values to typed ones),
:mod:`~zkcrawl.settings.validate`, :mod:`~zkcrawl.settings.deprecated` (old environment
names), :mod:`~zkcrawl.settings.show` (``--print-config``, masking secrets),
:mod:`~zkcrawl.settings.parser` (argparse) and :mod:`~zkcrawl.settings.load` (all of it,
in order). This package re-exports what the commands import.
"""

from zkcrawl.settings.common import CommonSettings, is_shared
from zkcrawl.settings.config_file import load_toml
from zkcrawl.settings.decode import MAX_FLOAT, MAX_INT
from zkcrawl.settings.load import parse, resolve
from zkcrawl.settings.options import (
    CONFIGURATION,
    DEDUP,
    DELIVERY,
    FETCHING,
    FILTERING,
    GROUP_ORDER,
    INPUT,
    LOGGING,
    OPERATIONS,
    OUTPUT,
    POLITENESS,
    QUEUE,
    SHARED_GROUPS,
    WORKERS,
    ZK_SECURITY,
    ZOOKEEPER,
    command_prefix,
    env_name,
    flag_name,
    opt,
)
from zkcrawl.settings.parser import (
    ArgumentParser,
    HelpFormatter,
    add_options,
    option_group,
    version,
)
from zkcrawl.settings.show import redacted, render_config
from zkcrawl.settings.sources import Source
from zkcrawl.settings.validate import (
    did_you_mean,
    header_value_problem,
    zk_hosts_problem,
    znode_path_problem,
)

__all__ = [
    "CONFIGURATION",
    "DEDUP",
    "DELIVERY",
    "FETCHING",
    "FILTERING",
    "GROUP_ORDER",
    "INPUT",
    "LOGGING",
    "MAX_FLOAT",
    "MAX_INT",
    "OPERATIONS",
    "OUTPUT",
    "POLITENESS",
    "QUEUE",
    "SHARED_GROUPS",
    "WORKERS",
    "ZK_SECURITY",
    "ZOOKEEPER",
    "ArgumentParser",
    "CommonSettings",
    "HelpFormatter",
    "Source",
    "add_options",
    "command_prefix",
    "did_you_mean",
    "env_name",
    "flag_name",
    "header_value_problem",
    "is_shared",
    "load_toml",
    "opt",
    "option_group",
    "parse",
    "redacted",
    "render_config",
    "resolve",
    "version",
    "zk_hosts_problem",
    "znode_path_problem",
]
