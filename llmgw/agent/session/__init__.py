"""The agent's end of the stream: register, heartbeat, carry out commands, reconnect.

One module per job: ``stream`` keeps the stream (the rounds of dialling, the backoff, following a
standby's word to the leader), ``dial`` opens one connection, ``addresses`` keeps the rotation of control
planes (``STATE_DIR/controlplanes.json``), ``handlers`` carries out each kind of message the control plane
sends (a table of kind -> handler), ``fencing`` refuses a deposed leader's commands, ``heartbeats`` sends
heartbeats and renews the node's certificate, ``enginecert`` asks for and takes the engines' certificate
(engine TLS, ``llmgw.agent.enginetls``), and ``outbox`` numbers and queues what goes out. This module
names what the rest of the agent uses.
"""

from __future__ import annotations

from llmgw.agent.session.addresses import (
    CONTROLPLANES_FILE,
    MAX_ADDR_LEN,
    MAX_LEARNED,
    control_addr,
    read_controlplanes,
    write_controlplanes,
)
from llmgw.agent.session.dial import CHANNEL_OPTIONS, CONNECT_TIMEOUT_S, REGISTER_TIMEOUT_S, Refused
from llmgw.agent.session.fencing import FENCED
from llmgw.agent.session.handlers import Commands
from llmgw.agent.session.stream import STANDBY_RETRY_S, Session

__all__ = ["CHANNEL_OPTIONS", "CONNECT_TIMEOUT_S", "CONTROLPLANES_FILE", "FENCED", "MAX_ADDR_LEN", "MAX_LEARNED",
           "REGISTER_TIMEOUT_S", "STANDBY_RETRY_S", "Commands", "Refused", "Session", "control_addr",
           "read_controlplanes", "write_controlplanes"]
