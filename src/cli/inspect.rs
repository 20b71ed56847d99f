//! `hob inspect`. STUB: the import/convert worker fills it in.

use super::InspectArgs;

pub fn run(args: &InspectArgs) -> crate::Result<()> {
    todo!("{args:?}")
}
