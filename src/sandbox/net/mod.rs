//! The sandbox's network: the egress proxy on a unix socket, the only way out of a local sandbox's own network
//! namespace, and the policy of what it lets through (`--network`); the model gateway, which keeps the agent's model
//! credentials with the bridge.

pub mod gateway;
pub mod proxy;
