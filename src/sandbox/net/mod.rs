//! The sandbox's network: the egress proxy on a unix socket, the only way out of a local sandbox's own network
//! namespace, the policy of what it lets through (`--network`) and what it asks the user under `--network ask`; the
//! model gateway, which keeps the agent's model credentials with the bridge.

pub mod ask;
pub mod gateway;
pub mod proxy;
