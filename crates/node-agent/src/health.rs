//! Per-GPU health as a state machine that can recover.
//!
//! ```text
//!            fault (XID not ignored, failed check)
//!  Healthy ─────────────────────────────────────────► Unhealthy{last_fault}
//!     ▲   ◄── quiet period with no new fault (recover on) ──┘   │ new fault:
//!     │                                                          └ last_fault = now
//!     │            force                      release
//!     └──────── Forced ◄───── any state ─────────► Healthy (faults cleared)
//! ```
//!
//! Pure: time comes in as an argument, so the machine is tested without a
//! clock.

use crate::backend::HealthEvent;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// Health policy.
#[derive(Clone, Debug)]
pub struct HealthPolicy {
    /// Offer a GPU again after it stayed clean this long.
    pub quiet_period: Duration,
    /// When off, an unhealthy GPU stays unhealthy until released or restart.
    pub recover: bool,
    /// XIDs caused by applications; they never mark a GPU unhealthy.
    pub ignored_xids: BTreeSet<u64>,
}

/// State of one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// No fault, or the quiet period passed since the last one.
    Healthy,
    /// Faulted; healthy again after a quiet period without faults (when recovery is on).
    Unhealthy {
        /// When the GPU became unhealthy.
        since: Instant,
        /// The latest fault (the quiet period counts from it).
        last_fault: Instant,
        /// The latest fault, in words (`xid 79`).
        reason: String,
    },
    /// Held unhealthy by fault injection or an operator.
    Forced {
        /// Why, as given.
        reason: String,
    },
}

impl State {
    /// True for [`State::Healthy`].
    pub fn is_healthy(&self) -> bool {
        matches!(self, State::Healthy)
    }
}

/// One GPU's record.
#[derive(Clone, Debug)]
pub struct GpuHealth {
    /// The GPU UUID.
    pub uuid: String,
    /// Its health.
    pub state: State,
    /// Every XID seen, ignored or not.
    pub xid_count: u64,
    /// Changes between healthy and unhealthy.
    pub transitions: u64,
}

/// Health of every GPU of the node.
#[derive(Clone, Debug)]
pub struct HealthTracker {
    policy: HealthPolicy,
    gpus: Vec<GpuHealth>,
    by_uuid: HashMap<String, usize>,
}

/// What an event did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The GPU's health changed.
    Changed {
        /// The GPU (inventory index).
        gpu: usize,
        /// Its new health.
        healthy: bool,
    },
    /// Recorded, no change of health.
    Unchanged,
    /// The event names no GPU of this node.
    UnknownGpu,
}

impl HealthTracker {
    /// All GPUs start healthy except those in `initially_unhealthy`.
    pub fn new(policy: HealthPolicy, uuids: &[String], initially_unhealthy: &[String]) -> Self {
        let gpus = uuids
            .iter()
            .map(|u| GpuHealth {
                uuid: u.clone(),
                state: if initially_unhealthy.contains(u) {
                    State::Forced {
                        reason: "unhealthy at start".into(),
                    }
                } else {
                    State::Healthy
                },
                xid_count: 0,
                transitions: 0,
            })
            .collect();
        let by_uuid = uuids
            .iter()
            .enumerate()
            .map(|(i, u)| (u.clone(), i))
            .collect();
        HealthTracker {
            policy,
            gpus,
            by_uuid,
        }
    }

    /// Every GPU's record (index = inventory index).
    pub fn gpus(&self) -> &[GpuHealth] {
        &self.gpus
    }

    /// True when GPU `gpu` (inventory index) is healthy; false for an unknown index.
    pub fn is_healthy(&self, gpu: usize) -> bool {
        self.gpus.get(gpu).is_some_and(|g| g.state.is_healthy())
    }

    fn set(&mut self, i: usize, state: State) -> Outcome {
        let g = &mut self.gpus[i];
        let was = g.state.is_healthy();
        let now = state.is_healthy();
        g.state = state;
        if was != now {
            g.transitions += 1;
            Outcome::Changed {
                gpu: i,
                healthy: now,
            }
        } else {
            Outcome::Unchanged
        }
    }

    fn fault(&mut self, i: usize, reason: String, now: Instant) -> Outcome {
        let state = match &self.gpus[i].state {
            State::Forced { .. } => return Outcome::Unchanged,
            State::Unhealthy { since, .. } => State::Unhealthy {
                since: *since,
                last_fault: now,
                reason,
            },
            State::Healthy => State::Unhealthy {
                since: now,
                last_fault: now,
                reason,
            },
        };
        self.set(i, state)
    }

    /// Applies one event observed at `now`.
    pub fn apply(&mut self, ev: &HealthEvent, now: Instant) -> Outcome {
        let Some(&i) = self.by_uuid.get(ev.gpu()) else {
            return Outcome::UnknownGpu;
        };
        match ev {
            // XID 0 is no XID: NVML's "no data", not a fault.
            HealthEvent::Xid { xid: 0, .. } => Outcome::Unchanged,
            HealthEvent::Xid { xid, .. } => {
                self.gpus[i].xid_count += 1;
                if self.policy.ignored_xids.contains(xid) {
                    Outcome::Unchanged
                } else {
                    self.fault(i, format!("xid {xid}"), now)
                }
            }
            HealthEvent::CheckFailed { reason, .. } => self.fault(i, reason.clone(), now),
            HealthEvent::Force { reason, .. } => self.set(
                i,
                State::Forced {
                    reason: reason.clone(),
                },
            ),
            HealthEvent::Release { .. } => self.set(i, State::Healthy),
        }
    }

    /// Recovers GPUs whose quiet period has passed; returns those that did.
    pub fn tick(&mut self, now: Instant) -> Vec<usize> {
        if !self.policy.recover {
            return Vec::new();
        }
        let due: Vec<usize> = self
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| {
                matches!(&g.state, State::Unhealthy { last_fault, .. }
                    if now.saturating_duration_since(*last_fault) >= self.policy.quiet_period)
            })
            .map(|(i, _)| i)
            .collect();
        for &i in &due {
            self.set(i, State::Healthy);
        }
        due
    }

    /// When the next recovery is due, if any.
    pub fn next_deadline(&self) -> Option<Instant> {
        if !self.policy.recover {
            return None;
        }
        self.gpus
            .iter()
            .filter_map(|g| match &g.state {
                State::Unhealthy { last_fault, .. } => Some(*last_fault + self.policy.quiet_period),
                _ => None,
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker(recover: bool) -> HealthTracker {
        HealthTracker::new(
            HealthPolicy {
                quiet_period: Duration::from_secs(60),
                recover,
                ignored_xids: [13, 43].into_iter().collect(),
            },
            &["a".into(), "b".into()],
            &[],
        )
    }

    fn xid(g: &str, x: u64) -> HealthEvent {
        HealthEvent::Xid {
            gpu: g.into(),
            xid: x,
        }
    }

    #[test]
    fn ignored_xids_do_not_mark_unhealthy() {
        let mut t = tracker(true);
        let now = Instant::now();
        assert_eq!(t.apply(&xid("a", 13), now), Outcome::Unchanged);
        assert!(t.is_healthy(0));
        assert_eq!(t.gpus()[0].xid_count, 1);
        assert_eq!(t.apply(&xid("zz", 79), now), Outcome::UnknownGpu);
    }

    /// `xid <gpu> 0` counted as a fault.
    #[test]
    fn xid_zero_counts_as_a_fault() {
        let mut t = tracker(true);
        assert_eq!(t.apply(&xid("a", 0), Instant::now()), Outcome::Unchanged);
        assert!(t.is_healthy(0));
        assert_eq!(t.gpus()[0].xid_count, 0);
    }

    #[test]
    fn recovers_after_quiet_period_and_new_faults_extend_it() {
        let mut t = tracker(true);
        let t0 = Instant::now();
        assert_eq!(
            t.apply(&xid("a", 79), t0),
            Outcome::Changed {
                gpu: 0,
                healthy: false
            }
        );
        assert_eq!(t.next_deadline(), Some(t0 + Duration::from_secs(60)));
        let t1 = t0 + Duration::from_secs(30);
        assert_eq!(t.apply(&xid("a", 48), t1), Outcome::Unchanged);
        assert!(t.tick(t0 + Duration::from_secs(61)).is_empty());
        assert_eq!(t.tick(t1 + Duration::from_secs(60)), vec![0]);
        assert!(t.is_healthy(0));
        assert_eq!(t.gpus()[0].transitions, 2);
        assert_eq!(t.next_deadline(), None);
    }

    #[test]
    fn no_recovery_when_off_and_forced_holds() {
        let mut t = tracker(false);
        let t0 = Instant::now();
        t.apply(&xid("a", 79), t0);
        assert!(t.tick(t0 + Duration::from_secs(3600)).is_empty());
        assert!(!t.is_healthy(0));
        let mut t = tracker(true);
        t.apply(
            &HealthEvent::Force {
                gpu: "b".into(),
                reason: "test".into(),
            },
            t0,
        );
        assert!(t.tick(t0 + Duration::from_secs(3600)).is_empty());
        assert!(!t.is_healthy(1));
        // a fault while forced does not lift the force
        assert_eq!(t.apply(&xid("b", 79), t0), Outcome::Unchanged);
        assert_eq!(
            t.apply(&HealthEvent::Release { gpu: "b".into() }, t0),
            Outcome::Changed {
                gpu: 1,
                healthy: true
            }
        );
    }
}
