//! A waiter's wake-ups: `LISTEN` on the channel of its own token (`lr_` and the token's
//! digits), on which a release names it when its turn comes. A notification only shortens the
//! wait: the waiter asks again at least every keep-alive/3 whatever arrives, so one that is lost
//! (a connection gone, a transaction-pooling PgBouncer that hands the LISTEN to another
//! client's server connection) costs time, never order or safety.

use std::rc::Rc;

use tokio::time::Instant;

use super::PgLock;
use super::conn::Conn;
use super::schema::quote_ident;
use super::sql::{self, Tx};
use crate::backend::{BackendError, Wakeup, Wakeups};

impl PgLock {
    /// Listens on this token's channel: confirmed by the server when this returns, and whether
    /// that was already so at the last attempt.
    pub(super) async fn listen(&self) -> Result<(Box<dyn Wakeups + '_>, bool), BackendError> {
        let channel = sql::channel(&self.token_now());
        if let Some(conn) = self.client.current() {
            let listening = conn.listening.borrow().as_deref() == Some(channel.as_str());
            if listening && self.covered.get() {
                return Ok((Box::new(PgWakeups { conn }), true));
            }
        }
        self.covered.set(false);
        let mut tx = Tx::default();
        tx.push(format!("LISTEN {}", quote_ident(&channel)));
        let deadline = Instant::now() + self.client.connect_timeout;
        self.client.exec(&tx, deadline, false).await?;
        let conn = self.client.current().ok_or_else(|| {
            BackendError::Transient(crate::text::message!(
                "lost the connection to PostgreSQL at {} after LISTEN",
                self.client.shown()
            ))
        })?;
        *conn.listening.borrow_mut() = Some(channel);
        Ok((Box::new(PgWakeups { conn }), false))
    }
}

/// Notifications on the connection that listens.
struct PgWakeups {
    conn: Rc<Conn>,
}

#[async_trait::async_trait(?Send)]
impl Wakeups for PgWakeups {
    async fn next(&mut self) -> Result<Wakeup, BackendError> {
        match self.conn.notification().await {
            // The payload is the token whose turn it is.
            Some(token) => Ok(Wakeup::Turn(token)),
            None => Err(BackendError::Transient(crate::text::message!(
                "the connection to PostgreSQL at {} that listened for releases closed",
                self.conn.host
            ))),
        }
    }
}
