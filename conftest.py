# The PostgreSQL server fixture serves unit tests (tests/) and integration tests alike.
pytest_plugins = ["integration.postgres_fixture"]
