//! Executes the tern-proto machines' actions and owns the data-plane threads: the sending and
//! the receiving side of a session, whoever set it up. Imports neither `client` nor `server`.

pub mod receiver;
pub mod sender;
