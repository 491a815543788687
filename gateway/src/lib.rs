//! Delta Fleet's gateway: HTTP API, SSE, web inbox, bot bridge and reconcilers (to be built).
//! It will answer interactions through the same validation the engine uses:
//! `delta_shared::protocol::InteractionRequest::validate`.
