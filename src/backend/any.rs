//! One type for any backend: [`AnyBackend`] holds whichever the URLs named, behind an
//! object-safe mirror of [`Backend`] (each future boxed, as object_store's one trait serves S3,
//! GCS and local files alike). The session, `status` and `release` are written once against
//! [`Backend`] and never branch on which backend they have.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::{Attempt, Backend, BackendError, Freed, Report, Tenure, Wakeup, Wakeups};
use crate::exit::Failure;
use crate::lease::Timings;

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// [`Backend`], object-safe.
trait DynBackend {
    fn tenure(&self) -> Tenure;
    fn queues(&self) -> bool;
    fn races(&self) -> bool;
    fn key(&self) -> &str;
    fn token(&self) -> String;
    fn prepare(&self) -> Result<(), Failure>;
    fn give_back(&self, timeout: Duration) -> Boxed<'_, Result<bool, BackendError>>;
    fn try_acquire<'a>(
        &'a self,
        timings: &'a Timings,
        listen: bool,
    ) -> Boxed<'a, Result<Attempt, BackendError>>;
    fn renew<'a>(
        &'a self,
        timings: &'a Timings,
        timeout: Duration,
    ) -> Boxed<'a, Result<bool, BackendError>>;
    fn release(
        &self,
        keep_for: Option<Duration>,
        timeout: Duration,
    ) -> Boxed<'_, Result<bool, BackendError>>;
    fn inspect(&self) -> Boxed<'_, Result<Report, BackendError>>;
    fn force_release<'a>(
        &'a self,
        token: Option<&'a str>,
    ) -> Boxed<'a, Result<Freed, BackendError>>;
    #[allow(clippy::type_complexity)]
    fn subscribe(&self) -> Boxed<'_, Result<(AnyWakeups<'_>, bool), BackendError>>;
}

impl<B: Backend> DynBackend for B {
    fn tenure(&self) -> Tenure {
        Backend::tenure(self)
    }
    fn queues(&self) -> bool {
        Backend::queues(self)
    }
    fn races(&self) -> bool {
        Backend::races(self)
    }
    fn key(&self) -> &str {
        Backend::key(self)
    }
    fn token(&self) -> String {
        Backend::token(self)
    }
    fn prepare(&self) -> Result<(), Failure> {
        Backend::prepare(self)
    }
    fn give_back(&self, timeout: Duration) -> Boxed<'_, Result<bool, BackendError>> {
        Box::pin(Backend::give_back(self, timeout))
    }
    fn try_acquire<'a>(
        &'a self,
        timings: &'a Timings,
        listen: bool,
    ) -> Boxed<'a, Result<Attempt, BackendError>> {
        Box::pin(Backend::try_acquire(self, timings, listen))
    }
    fn renew<'a>(
        &'a self,
        timings: &'a Timings,
        timeout: Duration,
    ) -> Boxed<'a, Result<bool, BackendError>> {
        Box::pin(Backend::renew(self, timings, timeout))
    }
    fn release(
        &self,
        keep_for: Option<Duration>,
        timeout: Duration,
    ) -> Boxed<'_, Result<bool, BackendError>> {
        Box::pin(Backend::release(self, keep_for, timeout))
    }
    fn inspect(&self) -> Boxed<'_, Result<Report, BackendError>> {
        Box::pin(Backend::inspect(self))
    }
    fn force_release<'a>(
        &'a self,
        token: Option<&'a str>,
    ) -> Boxed<'a, Result<Freed, BackendError>> {
        Box::pin(Backend::force_release(self, token))
    }
    fn subscribe(&self) -> Boxed<'_, Result<(AnyWakeups<'_>, bool), BackendError>> {
        Box::pin(async move {
            let (wakeups, covered) = Backend::subscribe(self).await?;
            Ok((AnyWakeups(Box::new(wakeups)), covered))
        })
    }
}

/// Whichever backend the URLs named.
pub struct AnyBackend(Box<dyn DynBackend>);

impl AnyBackend {
    pub fn new<B: Backend + 'static>(backend: B) -> AnyBackend {
        AnyBackend(Box::new(backend))
    }
}

/// [`Wakeups`], object-safe.
trait DynWakeups {
    fn next(&mut self) -> Boxed<'_, Result<Wakeup, BackendError>>;
}

impl<W: Wakeups> DynWakeups for W {
    fn next(&mut self) -> Boxed<'_, Result<Wakeup, BackendError>> {
        Box::pin(Wakeups::next(self))
    }
}

/// Any backend's release notifications.
pub struct AnyWakeups<'a>(Box<dyn DynWakeups + 'a>);

impl Wakeups for AnyWakeups<'_> {
    async fn next(&mut self) -> Result<Wakeup, BackendError> {
        self.0.next().await
    }
}

impl Backend for AnyBackend {
    type Wakeups<'a> = AnyWakeups<'a>;

    fn tenure(&self) -> Tenure {
        self.0.tenure()
    }
    fn queues(&self) -> bool {
        self.0.queues()
    }
    fn races(&self) -> bool {
        self.0.races()
    }
    fn key(&self) -> &str {
        self.0.key()
    }
    fn token(&self) -> String {
        self.0.token()
    }
    fn prepare(&self) -> Result<(), Failure> {
        self.0.prepare()
    }
    async fn give_back(&self, timeout: Duration) -> Result<bool, BackendError> {
        self.0.give_back(timeout).await
    }
    async fn try_acquire(&self, timings: &Timings, listen: bool) -> Result<Attempt, BackendError> {
        self.0.try_acquire(timings, listen).await
    }
    async fn renew(&self, timings: &Timings, timeout: Duration) -> Result<bool, BackendError> {
        self.0.renew(timings, timeout).await
    }
    async fn release(
        &self,
        keep_for: Option<Duration>,
        timeout: Duration,
    ) -> Result<bool, BackendError> {
        self.0.release(keep_for, timeout).await
    }
    async fn inspect(&self) -> Result<Report, BackendError> {
        self.0.inspect().await
    }
    async fn force_release(&self, token: Option<&str>) -> Result<Freed, BackendError> {
        self.0.force_release(token).await
    }
    async fn subscribe(&self) -> Result<(AnyWakeups<'_>, bool), BackendError> {
        self.0.subscribe().await
    }
}
