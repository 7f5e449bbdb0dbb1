//! The configuration in force. Its live value is a `watch` channel: the reload task owns the
//! sender (`reload::watch`), and every reader — requests, leases, the refresh sweep, upkeep —
//! holds a receiver. A request keeps the `Arc<Settings>` it started with, so a reload never
//! changes a request half-way. Without a watched file the sender is dropped at start and the
//! settings never change.

use crate::config::{AlertKind, Config, NamedModels};
use crate::engine::ProfileId;
use crate::engine::classify::Classifier;
use crate::prices::Prices;
use std::collections::HashSet;
use std::sync::Arc;
use tokio::sync::watch;

/// The config and what is derived from it.
pub struct Settings {
    pub config: Config,
    pub classifier: Classifier,
    /// `[prices]` over the shipped table: what an attempt's tokens cost.
    pub prices: Arc<Prices>,
    /// The models the config names: metric labels name only these (`Config::named_models`).
    pub named: Arc<NamedModels>,
    /// What a served request is checked for, when a rule listens for it (crate::alerts).
    pub served_alerts: Option<Arc<ServedAlerts>>,
}

/// The alerts a served request may raise: `fallback`, and `paid` (with the profiles the config
/// file declares paid; the store marks the others, `Roster::paid`).
#[derive(Debug, Default)]
pub struct ServedAlerts {
    pub fallback: bool,
    pub paid: Option<HashSet<ProfileId>>,
}

impl Settings {
    pub fn new(config: Config) -> Settings {
        let classifier = Classifier::with_overrides(config.classification.rules.clone());
        let prices = Arc::new(Prices::new(config.prices.clone()));
        let named = Arc::new(config.named_models());
        let listens = |kind| config.alerts.iter().any(|r| r.on.contains(&kind));
        let served = ServedAlerts {
            fallback: listens(AlertKind::Fallback),
            paid: listens(AlertKind::Paid)
                .then(|| config.auth.profiles.iter().filter(|(_, p)| p.paid).map(|(id, _)| id.clone()).collect()),
        };
        let served_alerts = (served.fallback || served.paid.is_some()).then(|| Arc::new(served));
        Settings { config, classifier, prices, named, served_alerts }
    }
}

/// A reader of the settings in force.
#[derive(Clone)]
pub struct Live(watch::Receiver<Arc<Settings>>);

impl Live {
    /// The settings in force now.
    pub fn get(&self) -> Arc<Settings> {
        self.0.borrow().clone()
    }

    /// The settings in force, when they changed since this reader last looked (`changed` or
    /// the channel's start); one atomic read when they did not.
    pub fn changed(&mut self) -> Option<Arc<Settings>> {
        self.0.has_changed().unwrap_or(false).then(|| self.0.borrow_and_update().clone())
    }
}

/// The sender (for the reload task) and the first reader of `settings`.
pub fn channel(settings: Settings) -> (watch::Sender<Arc<Settings>>, Live) {
    let (tx, rx) = watch::channel(Arc::new(settings));
    (tx, Live(rx))
}
