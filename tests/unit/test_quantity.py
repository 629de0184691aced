import pytest

from api import quantity


@pytest.mark.parametrize(
    ("raw", "milli"),
    [("250m", 250), ("1", 1000), ("1.5", 1500), ("0.0001", 1), (None, 0), (2, 2000)],
)
def test_cpu_is_parsed_to_millicores_rounding_up(raw, milli):
    assert quantity.millicores(raw) == milli


@pytest.mark.parametrize(
    ("raw", "value"),
    [("1Gi", 1 << 30), ("512Mi", 512 << 20), ("1G", 10**9), ("1.5Gi", 3 << 29), ("29", 29), ("", 0)],
)
def test_memory_and_counts_are_parsed_to_whole_units(raw, value):
    assert quantity.to_int(raw) == value


def test_bad_quantity_names_the_value():
    with pytest.raises(quantity.QuantityError, match="'12 parsecs'"):
        quantity.millicores("12 parsecs")


def test_formatting_round_trips_common_sizes():
    assert quantity.format_bytes(8 << 30) == "8Gi"
    assert quantity.format_millicores(1930) == "1930m"
    assert quantity.format_millicores(2000) == "2"


@pytest.mark.parametrize(
    "raw",
    [
        "100m",
        "1.5Gi",
        "2e3",
        "1E-3",
        "12k",
        "3M",
        "7Ti",
        "0.5",
        "+4",
        "-250m",
        ".5",
        "5.",
        "10n",
        "9u",
        "1Ei",
    ],
)
def test_parsing_agrees_with_the_official_client(raw):
    from kubernetes.utils.quantity import parse_quantity

    assert quantity.parse(raw) == parse_quantity(raw)


@pytest.mark.parametrize("raw", ["1Gb", "Mi", "1 Gi", "1.2.3", "e3", "1e", "--1"])
def test_malformed_quantities_are_refused(raw):
    with pytest.raises(quantity.QuantityError):
        quantity.parse(raw)
