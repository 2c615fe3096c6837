//! Files the command line reads whole (job files, with `--config`), read defensively:
//! [`meshfeed_analysis::input`], which also reads the records `meshfeed report` and
//! `meshfeed bench report` take.

pub use meshfeed_analysis::input::read_small;
