//! Both protocols under faults: fault injection with a predicted outcome per plan
//! ([`injection`]), the hostile-input catalog ([`hostile_inputs`]) and the opt-in soak
//! ([`soak`], `--ignored soak`). Worker processes some of them need are this binary itself,
//! run with an ignored "worker mode" test selected by its full name.

mod hostile_inputs;
mod injection;
mod soak;
