"""Spark's log for the demos: errors only, one line each.

With Spark's default profile an injected task failure prints two full Java +
Python stack traces; a real failure still shows in full as the driver's
exception.
"""

from __future__ import annotations

from pathlib import Path

_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
appender.console.layout.alwaysWriteExceptions = false
"""


def quiet_spark_conf(folder: Path) -> dict[str, str]:
    """Write the quiet log configuration into ``folder``; return the session settings that use it.

    ``defaultJavaOptions``, not ``extraJavaOptions``: the session's own JVM options stay.
    """
    log_conf = folder / "log4j2.properties"
    log_conf.write_text(_LOG4J2)
    return {"spark.driver.defaultJavaOptions": f"-Dlog4j2.configurationFile={log_conf.as_uri()}"}


__all__ = ["quiet_spark_conf"]
