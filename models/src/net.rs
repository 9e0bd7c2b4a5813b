//! The network every model's messages cross: a bag (any delivery order), where a message may
//! also be lost or duplicated within a fault budget, and wait any number of ticks.

use std::fmt::Debug;
use std::hash::Hash;

/// Messages in flight, kept sorted so that the same bag is the same state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Net<M> {
    pub bag: Vec<M>,
    /// Losses and duplications the environment may still make.
    pub losses: u8,
    pub dups: u8,
}

impl<M: Ord + Clone + Debug + Hash> Net<M> {
    pub fn new(losses: u8, dups: u8) -> Net<M> {
        Net {
            bag: Vec::new(),
            losses,
            dups,
        }
    }

    pub fn send(&mut self, m: M) {
        let at = self.bag.partition_point(|x| x < &m);
        self.bag.insert(at, m);
    }

    /// Takes the `i`th message out (delivered or lost).
    pub fn take(&mut self, i: usize) -> M {
        self.bag.remove(i)
    }

    /// The indices of distinct messages (a duplicate delivered first is the same step).
    pub fn distinct(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.bag.len()).filter(|&i| i == 0 || self.bag[i - 1] != self.bag[i])
    }

    /// How many messages match `f`.
    pub fn count(&self, f: impl Fn(&M) -> bool) -> usize {
        self.bag.iter().filter(|m| f(m)).count()
    }
}

/// The environment's actions on the bag, shared by every model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    Lose(usize),
    Duplicate(usize),
}

/// The faults possible now.
pub fn faults<M: Ord + Clone + Debug + Hash>(net: &Net<M>, out: &mut Vec<Fault>) {
    for i in net.distinct() {
        if net.losses > 0 {
            out.push(Fault::Lose(i));
        }
        if net.dups > 0 {
            out.push(Fault::Duplicate(i));
        }
    }
}

pub fn apply<M: Ord + Clone + Debug + Hash>(net: &mut Net<M>, fault: Fault) {
    match fault {
        Fault::Lose(i) => {
            net.take(i);
            net.losses -= 1;
        }
        Fault::Duplicate(i) => {
            let m = net.bag[i].clone();
            net.send(m);
            net.dups -= 1;
        }
    }
}
