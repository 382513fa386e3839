//! The coordination behaviour suite against a 3-replica ensemble.

coord_tests::coordination_suite!(3);
