//! Where what the ACP agent says goes: to the turn that runs in its session, through a channel the turn reads.

use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::Responder;
use agent_client_protocol::v1::schema::{
    CreateElicitationRequest, CreateElicitationResponse, RequestPermissionRequest, RequestPermissionResponse,
};
use tokio::sync::mpsc;

/// What the agent says to the turn that runs.
pub enum Event {
    /// One `session/update` of its session, as JSON.
    Update(String),
    /// It asks the user to allow a tool call.
    Permission(Box<(RequestPermissionRequest, Responder<RequestPermissionResponse>)>),
    /// It asks the user to fill in a form of its session.
    Elicit(Box<(CreateElicitationRequest, Responder<CreateElicitationResponse>)>),
}

/// Where the running turn's messages go: its conversation, and the turn's end of the channel.
pub type Route = Arc<Mutex<Option<(String, mpsc::Sender<Event>)>>>;

/// The channel of the turn that runs in `session`, if one does.
pub fn sender(route: &Route, session: &str) -> Option<mpsc::Sender<Event>> {
    let route = route.lock().unwrap_or_else(|p| p.into_inner());
    route.as_ref().filter(|(routed, _)| routed == session).map(|(_, tx)| tx.clone())
}
