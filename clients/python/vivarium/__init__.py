"""Vivarium's Python client: run untrusted Python in sandboxes on a Vivarium
server (``vivarium serve``), standard library only.

    from vivarium import Client

    client = Client()                      # VIVARIUM_URL, VIVARIUM_API_KEY
    with client.create_sandbox() as sb:
        sb.execute("x = 41")
        print(sb.execute("x + 1").text)    # 42

``vivarium.langchain`` has a LangChain tool (it needs langchain-core).
"""

from .client import Client, CommandResult, Execution, ExecutionError, Result, Sandbox, Volume
from .errors import (AuthenticationError, ConnectionFailed, InvalidRequestError, NotAllowedError, NotFoundError,
                     QuotaExceededError, SandboxBusyError, SandboxClosedError, SandboxPausedError, ServerError,
                     ServerUnavailableError, TooLargeError, VivariumError, VolumeInUseError)

__all__ = [
    "Client", "Sandbox", "Volume", "Execution", "ExecutionError", "Result", "CommandResult",
    "VivariumError", "ConnectionFailed", "InvalidRequestError", "AuthenticationError", "NotAllowedError", "NotFoundError",
    "SandboxBusyError", "SandboxClosedError", "SandboxPausedError", "TooLargeError", "QuotaExceededError",
    "ServerUnavailableError", "ServerError", "VolumeInUseError",
]

__version__ = "0.1.0"
