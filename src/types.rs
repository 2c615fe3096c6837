//! Newtypes for the numbers that are easy to mix up: ranks, sample ids, epochs, steps.

use std::fmt;

macro_rules! newtype {
    ($(#[$m:meta])* $name:ident($inner:ty)) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default,
                 serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

newtype!(
    /// A process in the loader's world, `0..world_size`.
    Rank(usize)
);
newtype!(
    /// A global sample id: position in file order, then row order (`0..N`).
    SampleId(u64)
);
newtype!(
    /// An epoch number; each epoch has its own permutation.
    Epoch(u64)
);
newtype!(
    /// A step (global batch index) within an epoch.
    Step(u64)
);
