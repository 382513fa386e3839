//! The coordination behaviour suite against a single replica.

coord_tests::coordination_suite!(1);
