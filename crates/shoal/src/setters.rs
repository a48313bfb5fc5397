//! The chaining setters of the option structs: one macro, used by [`Options`](crate::Options)
//! (in `db`) and [`DoppelOptions`](crate::doppel::DoppelOptions) (in `doppel`), so that
//! neither module reaches into the other for it.

/// Generates, on the type named first, the chaining setter `with_<field>` of each listed
/// field: it takes and returns the value (`#[must_use]`), and its doc comment links to the
/// field's. Used for [`Options`](crate::Options) and for
/// [`DoppelOptions`](crate::doppel::DoppelOptions), the builders of `#[non_exhaustive]`
/// option structs.
macro_rules! setters {
    ($target:ty; $($setter:ident => $field:ident: $ty:ty),* $(,)?) => {
        impl $target {
            $(
                #[doc = concat!("Sets [`", stringify!($field), "`](Self::", stringify!($field), ").")]
                #[must_use]
                pub fn $setter(mut self, $field: $ty) -> Self {
                    self.$field = $field;
                    self
                }
            )*
        }
    };
}
pub(crate) use setters;
