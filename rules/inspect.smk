rule inspect:
    """Op histogram, weight bytes, I/O, deployment target and the static ANE lint of one package."""
    input:
        package="artifacts/{model}/packages/{stage}/{bucket}.mlpackage",
        code=WF.convert_code(),
    output:
        "artifacts/{model}/inspect/{stage}/{bucket}.json",
    log:
        "artifacts/{model}/logs/inspect/{stage}/{bucket}.log",
    script:
        "../workflow_scripts/inspect.py"
